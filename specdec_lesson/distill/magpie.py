"""User questions written by the target itself (Magpie: Xu et al., 2024, "Magpie: alignment data synthesis from scratch").

An instruct model fed only the start of a chat, up to where the user's message begins, writes a plausible user
message and ends it with its end-of-turn token.  ``user_turn_prefix`` finds that start from the tokenizer's own
chat template (for SmolLM2 it includes the default system prompt the template adds:
``<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\\n
<|im_start|>user\\n``); ``sample_user_turns`` samples many continuations at once (T = 1, top-p 0.95, one
``torch.Generator``), and ``clean_question`` keeps a sample only if it ended with the end-of-turn token and looks
like a question a person would type: 4 to 80 words, at most 8 lines, mostly letters, no special tokens, no
degenerate repetition.  About half of SmolLM2-135M's samples pass.
"""

from __future__ import annotations

import re

import torch

from ..sampling import logits_to_probs

__all__ = ["user_turn_prefix", "sample_user_turns", "clean_question", "MAGPIE_SETTINGS"]

MAGPIE_SETTINGS = {"temperature": 1.0, "top_p": 0.95, "max_new": 96}
_MARK = "\x00MAGPIE-USER-TURN\x00"


def user_turn_prefix(tokenizer) -> str:
    """The chat template's text before the first user message's content (any default system prompt included)."""
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("the tokenizer has no chat template, so there is no user-turn prefix to sample questions "
                         "after; use an instruct model's tokenizer")
    text = tokenizer.apply_chat_template([{"role": "user", "content": _MARK}], add_generation_prompt=False, tokenize=False)
    if _MARK not in text:
        raise ValueError("the tokenizer's chat template does not copy the user message verbatim; Magpie sampling "
                         "needs a template that does")
    return text[: text.index(_MARK)]


@torch.no_grad()
def sample_user_turns(model, prefix_ids: list[int], n: int, max_new: int, generator: torch.Generator, eos_token_id: int,
                      temperature: float = 1.0, top_p: float | None = 0.95) -> list[tuple[list[int], bool]]:
    """``n`` continuations of ``prefix_ids`` sampled together with a KV cache: per row (token ids without the
    end-of-turn token, whether it ended with ``eos_token_id`` within ``max_new`` tokens).  Finished rows leave the
    batch, so the draws depend only on ``generator``'s state and the inputs."""
    from transformers import DynamicCache

    ids = torch.tensor([prefix_ids] * n)  # [n, P]
    cache = DynamicCache(config=model.config)
    head = model.get_output_embeddings().weight  # [V, H]
    last_h = model.model(input_ids=ids, cache=cache, use_cache=True).last_hidden_state[:, -1]  # [n, H]
    out: list[list[int]] = [[] for _ in range(n)]
    ended = [False] * n
    alive = torch.arange(n)  # [b'] original row of each live row
    pos = len(prefix_ids)
    for step in range(max_new):
        probs = logits_to_probs(last_h.float() @ head.T, temperature, None, top_p, validate=False)  # [b', V]
        tok = torch.multinomial(probs, 1, generator=generator)[:, 0]  # [b']
        done = tok == eos_token_id  # [b']
        for j, b in enumerate(alive.tolist()):
            if bool(done[j]):
                ended[b] = True
            else:
                out[b].append(int(tok[j]))
        if step == max_new - 1 or bool(done.all()):
            break
        if bool(done.any()):
            keep = (~done).nonzero()[:, 0]  # [b'']
            for layer in cache.layers:
                layer.batch_select_indices(keep)
            alive, tok = alive[keep], tok[keep]
        last_h = model.model(input_ids=tok[:, None], position_ids=torch.full((len(alive), 1), pos), cache=cache,
                             use_cache=True).last_hidden_state[:, 0]  # [b', H]
        pos += 1
    return list(zip(out, ended))


def clean_question(text: str, ended: bool) -> str | None:
    """``text`` stripped if it is a usable user question, else None (unfinished, too short or long, special tokens,
    mostly non-letters, degenerate repetition)."""
    text = text.strip()
    words = text.split()
    if not ended or not 4 <= len(words) <= 80 or len(text) > 700 or "<|" in text or text.count("\n") > 7:
        return None
    letters = sum(c.isalpha() for c in text)
    if letters < 0.6 * sum(not c.isspace() for c in text):
        return None
    lower = [w.lower() for w in words]
    if len(lower) >= 10 and len(set(lower)) < 0.5 * len(lower):
        return None
    if re.search(r"\b(\w+)(\W+\1\b){3,}", text, flags=re.IGNORECASE):  # a word four times in a row
        return None
    return text
