"""Exercises of notebook 03 (KV-cache rollback), part 1: the target's crop, and a planted draft-cache bug whose
effect on the text and on alpha is predicted before it runs.

Ground truth is recomputation: plain greedy decoding (:func:`specdec_lesson.speculative.autoregressive_generate`)
for the target's crop, and for the draft's a toy loop whose draft cache is a token list, run with the correct crop."""

from __future__ import annotations

import torch

from ._core import Exercise, call, fail, passed, solve

__all__ = ["check_target_keep", "check_draft_cache_prediction", "EXERCISES"]


def _tiny():
    from ..drafters import noisy_copy
    from ..models import tiny_pair

    target = tiny_pair(vocab_size=64)[0]
    return target, noisy_copy(target, 0.1)  # accepted often, not always: every n = 0..K occurs


@torch.inference_mode()
def _cached_greedy(ex: str, target, draft, prompt: list[int], n_new: int, k: int, target_keep) -> list[int]:
    """Greedy speculative decoding with two DynamicCaches (notebook 02's loop); the target's crop from ``target_keep``."""
    from transformers.cache_utils import DynamicCache

    from ..kvcache import crop

    t_cache, d_cache = DynamicCache(), DynamicCache()
    target(input_ids=torch.tensor([prompt[:-1]]), cache=t_cache, use_cache=True)
    draft(input_ids=torch.tensor([prompt[:-1]]), cache=d_cache, use_cache=True)
    pending, d_pending, out = prompt[-1], [prompt[-1]], []
    while len(out) < n_new:
        k_step = max(1, min(k, n_new - len(out) - 1))
        d_len0, feed, tokens = d_cache.get_seq_length(), d_pending, []
        for _ in range(k_step):
            tokens.append(int(draft(input_ids=torch.tensor([feed]), cache=d_cache, use_cache=True).logits[0, -1].argmax()))
            feed = tokens[-1:]
        t_len0 = t_cache.get_seq_length()
        best = target(input_ids=torch.tensor([[pending] + tokens]), cache=t_cache, use_cache=True).logits[0].argmax(-1)
        n = int((best[:k_step] == torch.tensor(tokens)).long().cumprod(0).sum())
        nxt = int(best[n])
        keep = call(ex, target_keep, t_len0, k_step, n, what=f"target_keep({t_len0}, {k_step}, {n})")
        if not isinstance(keep, int) or not 0 <= keep <= t_cache.get_seq_length():
            fail(ex, f"target_keep({t_len0}, k={k_step}, n={n}) = {keep!r}, but the cache holds {t_len0} + {k_step + 1} = "
                     f"{t_cache.get_seq_length()} slots after the verify forward: keep a count between 0 and that")
        crop(t_cache, keep)
        crop(d_cache, d_len0 + len(d_pending) + min(n, k_step - 1))
        d_pending = [tokens[-1], nxt] if n == k_step else [nxt]
        pending = nxt
        out += tokens[:n] + [nxt]
    return out[:n_new]


def check_target_keep(fn) -> None:
    """``fn(cache_len_before, k, n_accepted)`` -> slots the target's cache keeps after a verify step that fed
    ``[pending, d_1..d_K]``; checked by running greedy speculative decoding with it (tiny float64 Llama, noisy-copy
    draft, K = 2, 3, 5, three prompts, 24 tokens) against plain greedy decoding of the same target."""
    ex = "3.1"
    from ..speculative import autoregressive_generate

    target, draft = _tiny()
    prompts = [[11, 5, 42, 7, 19, 3], [1, 2, 3, 4, 5], [60, 9]]
    for prompt in prompts:
        ref = autoregressive_generate(target, [prompt], 24)[0][0].tolist()
        for k in (2, 3, 5):
            got = _cached_greedy(ex, target, draft, prompt, 24, k, fn)
            if got != ref:
                first = next(i for i, (a, b) in enumerate(zip(got, ref)) if a != b)
                fail(ex, f"prompt {prompt}, K = {k}: the text differs from plain greedy decoding from token {first} on "
                         f"({got[first]} instead of {ref[first]}): the cache keeps a rejected slot or drops an accepted "
                         "one. The verify forward wrote pending, d_1..d_K; keep the pending token and the n accepted.")
    passed(ex, "your crop keeps exactly the committed prefix: 9 greedy runs equal plain greedy decoding, token for token.")


# ----------------------------------------------------------------------------- 3.2: a toy loop with a list "cache"
def _toy_text(seed: int, vocab: int = 8, length: int = 110) -> tuple[list[list[int]], list[int]]:
    """A rule ``next = rule[a][b]`` on the last two tokens, and a text that follows it 80% of the time: the target
    knows the text (its greedy continuation), the draft knows only the rule, so it is right when its context is."""
    g = torch.Generator().manual_seed(seed)
    rule = torch.randint(0, vocab, (vocab, vocab), generator=g)  # [V, V]
    text = torch.randint(0, vocab, (2,), generator=g).tolist()
    while len(text) < length:
        noisy = float(torch.rand(1, generator=g)) < 0.2
        text.append(int(torch.randint(0, vocab, (1,), generator=g)) if noisy else int(rule[text[-2], text[-1]]))
    return rule.tolist(), text


def _toy_run(ex: str, draft_keep, seed: int, k: int = 4) -> tuple[list[int], float, bool]:
    """Greedy speculative decoding where the draft's KV cache is the list of tokens it has consumed (the draft
    reads its last two); the draft's crop after each step from ``draft_keep``.  Returns (text, alpha, whether
    draft_keep ever differed from the correct rule)."""
    rule, text = _toy_text(seed)
    n_new = 100  # the text holds two prompt tokens, these and a margin for the last step's drafts
    d_cache, d_pending, out, accepted, rejections, differed = text[:1], text[1:2], [], 0, 0, False
    while len(out) < n_new:
        k_step = max(1, min(k, n_new - len(out) - 1))
        d_len0, feed, tokens = len(d_cache), d_pending, []
        for _ in range(k_step):
            d_cache += feed
            tokens.append(rule[d_cache[-2]][d_cache[-1]])
            feed = tokens[-1:]
        at, n = 2 + len(out), 0  # the target's greedy tokens are text[at:]
        while n < k_step and text[at + n] == tokens[n]:
            n += 1
        nxt = text[at + n]
        keep = call(ex, draft_keep, d_len0, len(d_pending), n, k_step,
                    what=f"draft_keep({d_len0}, {len(d_pending)}, {n}, {k_step})")
        if not isinstance(keep, int) or keep < 0:
            fail(ex, f"draft_keep must return a slot count (an int >= 0), got {keep!r}")
        differed |= keep != d_len0 + len(d_pending) + min(n, k_step - 1)
        del d_cache[keep:]  # like crop, but a count past the end keeps everything
        d_pending = [tokens[-1], nxt] if n == k_step else [nxt]
        out += tokens[:n] + [nxt]
        accepted, rejections = accepted + n, rejections + (n < k_step)
    return out[:n_new], accepted / (accepted + rejections), differed


def check_draft_cache_prediction(draft_keep, prediction: dict) -> None:
    """``draft_keep(d_len0, n_fed, n_accepted, k)``: a draft-cache crop with a planted off-by-one (the correct rule
    keeps ``d_len0 + n_fed + min(n_accepted, k - 1)``); ``prediction``: ``{"same_text": bool, "alpha": "lower" |
    "equal" | "higher"}`` made before running.  The check runs greedy toy decoding (a draft that reads the last two
    tokens of its cache, K = 4, 3 texts of 100 tokens) with the correct crop and with yours, and compares the text
    and alpha (a change under 0.01 counts as "equal") with your prediction."""
    ex = "3.2"
    if not isinstance(prediction, dict) or set(prediction) != {"same_text", "alpha"}:
        fail(ex, 'prediction must be a dict {"same_text": True or False, "alpha": "lower", "equal" or "higher"}')
    if not isinstance(prediction["same_text"], bool) or prediction["alpha"] not in ("lower", "equal", "higher"):
        fail(ex, f'fill in the prediction: "same_text" True or False, "alpha" one of "lower", "equal", "higher"; got '
                 f"{prediction}")
    correct = lambda d_len0, n_fed, n, k: d_len0 + n_fed + min(n, k - 1)  # noqa: E731
    runs = {name: [_toy_run(ex, rule, seed) for seed in (0, 1, 2)]
            for name, rule in (("correct", correct), ("yours", draft_keep))}
    if not any(r[2] for r in runs["yours"]):
        fail(ex, "your draft_keep never kept a different number of slots than the correct rule: plant the bug first "
                 "(e.g. keep one slot too many, the first rejected draft)")
    same = all(a[0] == b[0] for a, b in zip(runs["correct"], runs["yours"]))
    alpha_c, alpha_b = (sum(r[1] for r in runs[name]) / 3 for name in ("correct", "yours"))
    measured = "lower" if alpha_b < alpha_c - 0.01 else "higher" if alpha_b > alpha_c + 0.01 else "equal"
    if same != prediction["same_text"]:
        fail(ex, f"you predicted same_text={prediction['same_text']}, but the text is {'the same' if same else 'different'}"
                 ". The target verifies every drafted token: what can a bug in the DRAFT's cache change?")
    if measured != prediction["alpha"]:
        fail(ex, f"you predicted alpha {prediction['alpha']}, measured {alpha_b:.3f} with your bug against {alpha_c:.3f} "
                 f"correct ({measured}). Which context does the draft condition on after your crop?")
    passed(ex, f"as predicted: the same text, and alpha {alpha_b:.3f} instead of {alpha_c:.3f}: a draft-cache bug "
               "only costs speed, so no exactness test finds it; only the acceptance does.")


_P31 = """The verify step fed `[pending, d_1, ..., d_K]` to the target, so its cache grew from `cache_len_before` to
`cache_len_before + K + 1` slots. Write `target_keep(cache_len_before, k, n_accepted)`: how many slots to keep after
n of the K drafts were accepted (the next token, from the residual or the bonus, is not in the cache yet: it is
the next step's pending token). The check runs greedy speculative decoding with your crop on a tiny model and
compares the text with plain greedy decoding."""

_S31 = '''from specdec_lesson.exercises import check_target_keep


def target_keep(cache_len_before, k, n_accepted):
    """Slots of the target's cache to keep after a verify step."""
    raise NotImplementedError


check_target_keep(target_keep)
'''

_A31 = solve(_S31, '''
    return cache_len_before + 1 + n_accepted   # pending + the accepted drafts
''')

_P32 = """The draft's cache needs the same crop: before the step it held `d_len0` slots; the step fed `n_fed` pending
tokens (1, or 2 after a full acceptance: d_K and the bonus) and then d_1..d_{K-1} (d_K is proposed but never fed),
so the right crop keeps `d_len0 + n_fed + min(n_accepted, k - 1)`. Plant an off-by-one in `draft_keep`, and BEFORE
running predict: does the generated text change? Is alpha lower, equal or higher? The check runs a toy whose draft
reads the last two tokens of its cache, with the correct crop and with yours."""

_S32 = '''from specdec_lesson.exercises import check_draft_cache_prediction


def draft_keep(d_len0, n_fed, n_accepted, k):
    """The draft cache's crop, with a planted off-by-one."""
    raise NotImplementedError


prediction = {"same_text": None, "alpha": None}   # True / False; "lower", "equal" or "higher"
check_draft_cache_prediction(draft_keep, prediction)
'''

_A32 = solve(solve(_S32, '''
    return d_len0 + n_fed + min(n_accepted, k - 1) + 1   # BUG: keeps the first rejected draft
'''), 'prediction = {"same_text": True, "alpha": "lower"}\n',
             'prediction = {"same_text": None, "alpha": None}   # True / False; "lower", "equal" or "higher"\n')

EXERCISES = [
    Exercise("3.1", "the target's crop", check_target_keep, _P31, _S31, _A31),
    Exercise("3.2", "plant a draft-cache bug, predict alpha", check_draft_cache_prediction, _P32, _S32, _A32),
]
