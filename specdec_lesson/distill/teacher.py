"""Running the target to make teacher data for the distilled draft (``python -m specdec_lesson.distill gen|corpus``).

Two ways, both recording for every position the token and the target's last hidden state after the final norm
(the feature the engine passes to a feature-level drafter; teacher logits are recomputed from it in training):

* ``generate_teacher`` / ``run_gen``: the target ANSWERS training prompts (greedy or sampled), batched with a KV
  cache: the exact distribution of its replies, at about 100 positions/s on 2 cores;
* ``teacher_forced_rows`` / ``run_corpus``: one forward over a given text (real code as the reply to a code
  prompt): about 5x more positions per second, on text the target did not write (its laws are still the labels).

Shards are written atomically (``atomic_save``: a temporary file, fsync, rename) and skipped when present, so an
interrupted run resumes; ``load_shards`` names a shard that is unreadable anyway (a copy cut short, a full disk)
and says how to remake it.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from .data import chat_text, training_prompts

__all__ = ["atomic_save", "load_file", "generate_teacher", "teacher_forced_rows", "forward_in_batches", "run_gen",
           "run_corpus", "load_shards", "shard_paths"]


def atomic_save(obj, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as fh:
            torch.save(obj, fh)
            fh.flush()
            os.fsync(fh.fileno())  # on disk before the rename: a crash leaves the old file or the whole new one
        os.replace(tmp, path)  # atomic: the file is complete or absent
    finally:
        if tmp.exists():
            tmp.unlink()


def load_file(path: Path, what: str, fix: str):
    """``torch.load(path)``, or one ValueError naming the file, what it is and ``fix`` if it is unreadable."""
    try:
        return torch.load(path)
    except FileNotFoundError:
        raise ValueError(f"{what} {path} does not exist; {fix}") from None
    except Exception as exc:  # a truncated zip, a bad pickle, ...: whatever torch raises
        msg = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ValueError(f"{what} {path} is unreadable, truncated or corrupt ({type(exc).__name__}: {msg}); {fix}") from None


def _teacher(fast: bool, seed: int):
    if fast:
        from ..models import tiny_llama

        return tiny_llama(vocab_size=96, hidden_size=32, num_layers=2, seed=seed, dtype=torch.float32), None
    from ..models import load_default_target

    return load_default_target(verbose=False)


def _fast_prompts(n: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 96, (int(torch.randint(4, 12, (1,), generator=g)),), generator=g).tolist() for _ in range(n)]


def run_gen(out: Path, n_code: int, n_math: int, batch: int, max_new: int, seed: int, worker: int = 0,
            workers: int = 1, sample_every: int = 5, fast: bool = False, progress: bool = True,
            max_shards: int | None = None) -> int:
    """Write ``out/data/shard_XXXXX.pt`` (``shard_s{seed}_XXXXX.pt`` for seed != 0) for this worker's batches among
    the first ``max_shards``; returns the number of shards written."""
    from tqdm import tqdm

    model, tok = _teacher(fast, seed)
    if fast:
        prompts = _fast_prompts(n_code + n_math, seed)
        kinds = ["code"] * len(prompts)
        eos, pad = 2, 2
    else:
        items = training_prompts(n_code, n_math, seed)
        kinds = [k for k, _ in items]
        prompts = [tok(chat_text(tok, t), add_special_tokens=False)["input_ids"] for _, t in items]
        eos, pad = tok.eos_token_id, tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    n_batches = (len(prompts) + batch - 1) // batch
    if max_shards is not None:
        n_batches = min(n_batches, max_shards)
    mine = [i for i in range(n_batches) if i % workers == worker]
    written = 0
    for i in tqdm(mine, desc=f"gen w{worker}", disable=not progress):
        path = out / "data" / (f"shard_{i:05d}.pt" if seed == 0 else f"shard_s{seed}_{i:05d}.pt")
        if path.exists():
            continue
        temperature = 0.7 if sample_every and i % sample_every == sample_every - 1 else 0.0
        gen = torch.Generator().manual_seed(seed * 1_000_003 + i)  # one stream per shard: resumable, never reseeded in a loop
        sl = slice(i * batch, (i + 1) * batch)
        rows = generate_teacher(model, prompts[sl], max_new, temperature, gen, eos, pad)
        for r, k in zip(rows, kinds[sl]):
            r["kind"], r["temperature"] = k, temperature
        atomic_save(rows, path)
        written += 1
    return written


def run_corpus(out: Path, n: int, seed: int, shard_size: int = 64, budget: int = 4096, max_len: int = 1024,
               fast: bool = False, progress: bool = True, max_shards: int | None = None) -> int:
    """Teacher-forced data (``data.code_corpus``): one target forward per sequence, no generation, so
    about 5x more positions per second than ``gen``.  Writes ``out/data/shard_tf{seed}_XXXXX.pt``; resumable."""
    from tqdm import tqdm

    from .data import code_corpus

    model, tok = _teacher(fast, seed)
    if fast:
        seqs = _fast_prompts(2 * n, seed)
        items = [(seqs[2 * i], seqs[2 * i + 1] + [2]) for i in range(n)]
    else:
        items = [(tok(chat_text(tok, u), add_special_tokens=False)["input_ids"],
                  tok(a, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]) for u, a in code_corpus(n, seed)]
    if not items:
        raise ValueError("the code corpus is empty")
    written = 0
    starts = list(range(0, len(items), shard_size))[:max_shards]
    for i in tqdm(starts, desc="corpus", disable=not progress):
        path = out / "data" / f"shard_tf{seed}_{i // shard_size:05d}.pt"
        if path.exists():
            continue
        chunk = sorted(items[i: i + shard_size], key=lambda pa: len(pa[0]) + len(pa[1]))
        seqs = [(p + a)[:max_len] for p, a in chunk]
        rows = forward_in_batches(model, seqs, [min(len(p), max_len - 1) for p, _ in chunk], budget)
        for r in rows:
            r["kind"], r["temperature"], r["source"] = "code", None, "corpus"
        atomic_save(rows, path)
        written += 1
    return written


def forward_in_batches(model, seqs: list[list[int]], n_prompts: list[int], budget: int,
                       aux_layers: tuple[int, ...] | None = None) -> list[dict]:
    """``teacher_forced_rows`` over length-sorted ``seqs`` in sub-batches of at most ``budget`` padded positions."""
    rows, j = [], 0
    while j < len(seqs):
        m = 1
        while j + m < len(seqs) and len(seqs[j + m]) * (m + 1) <= budget:
            m += 1
        rows += teacher_forced_rows(model, seqs[j: j + m], n_prompts[j: j + m], aux_layers)
        j += m
    return rows


def shard_paths(out: Path) -> list[Path]:
    return sorted((out / "data").glob("shard_*.pt"))


def load_shards(out: Path) -> list[dict]:
    """Every row of every shard under ``out/data``; ValueError naming a shard that is unreadable or malformed."""
    rows = []
    for p in shard_paths(out):
        cmd = "corpus" if p.name.startswith("shard_tf") else "features" if p.name.startswith("shard_ans") else "gen"
        fix = f"delete it and rerun {cmd} with the same arguments to rewrite it"
        part = load_file(p, "the teacher shard", fix)
        if not isinstance(part, list) or not all(isinstance(r, dict) and {"tokens", "feats", "n_prompt"} <= set(r) for r in part):
            raise ValueError(f"the teacher shard {p} is not a list of rows with tokens, feats and n_prompt; {fix}")
        rows.extend(part)
    return rows


@torch.no_grad()
def teacher_forced_rows(model, sequences: list[list[int]], n_prompts: list[int],
                        aux_layers: tuple[int, ...] | None = None) -> list[dict]:
    """One forward over each whole sequence (right-padded batch): rows like ``generate_teacher``'s; with
    ``aux_layers`` also ``"aux"`` fp16 [L-1, len * H], the residual streams entering those layers (EAGLE-3's input)."""
    B, L = len(sequences), max(len(s) for s in sequences)
    ids = torch.zeros(B, L, dtype=torch.long)  # [B, L]
    mask = torch.zeros(B, L, dtype=torch.long)  # [B, L]
    for b, s in enumerate(sequences):
        ids[b, : len(s)] = torch.tensor(s)
        mask[b, : len(s)] = 1
    out = model.model(input_ids=ids, attention_mask=mask, output_hidden_states=bool(aux_layers))
    h = out.last_hidden_state  # [B, L, H]
    aux = torch.cat([out.hidden_states[i] for i in aux_layers], -1) if aux_layers else None  # [B, L, len * H]
    rows = []
    for b, (s, n) in enumerate(zip(sequences, n_prompts)):
        rows.append({"tokens": torch.tensor(s, dtype=torch.int32), "feats": h[b, : len(s) - 1].to(torch.float16), "n_prompt": n})
        if aux is not None:
            rows[-1]["aux"], rows[-1]["aux_layers"] = aux[b, : len(s) - 1].to(torch.float16), list(aux_layers)
    return rows


@torch.no_grad()
def generate_teacher(
    model, prompt_ids: list[list[int]], max_new_tokens: int, temperature: float, generator: torch.Generator,
    eos_token_id: int, pad_token_id: int,
) -> list[dict]:
    """Target responses with KV cache; returns per row {"tokens": int32 [L], "feats": fp16 [L-1, H], "n_prompt"}.
    feats[t] is the target's last hidden state (after the final norm) at position t, i.e. the feature that
    predicts tokens[t+1].  Finished rows leave the batch (``batch_select_indices``)."""
    from transformers import DynamicCache

    B = len(prompt_ids)
    L = max(len(p) for p in prompt_ids)
    ids = torch.full((B, L), pad_token_id, dtype=torch.long)  # [B, L]
    mask = torch.zeros(B, L, dtype=torch.long)  # [B, L]
    for b, p in enumerate(prompt_ids):
        ids[b, L - len(p):] = torch.tensor(p)
        mask[b, L - len(p):] = 1
    pos = (mask.cumsum(-1) - 1).clamp(min=0)  # [B, L]
    cache = DynamicCache(config=model.config)
    head = model.get_output_embeddings().weight  # [V, H]
    h = model.model(input_ids=ids, attention_mask=mask, position_ids=pos, cache=cache, use_cache=True).last_hidden_state
    feats = [[h[b, L - len(p):].to(torch.float16)] for b, p in enumerate(prompt_ids)]  # per row: list of [*, H]
    new = [[] for _ in range(B)]
    alive = torch.arange(B)  # [b'] original row of each live row
    last_h = h[:, -1]  # [b', H]
    last_pos = pos[:, -1]  # [b']
    for step in range(max_new_tokens):
        logits = last_h.float() @ head.T  # [b', V]
        if temperature == 0:
            tok = logits.argmax(-1)  # [b']
        else:
            tok = torch.multinomial(torch.softmax(logits / temperature, -1), 1, generator=generator)[:, 0]  # [b']
        for j, b in enumerate(alive.tolist()):
            new[b].append(int(tok[j]))
        done = tok == eos_token_id  # [b']
        if step == max_new_tokens - 1 or bool(done.all()):
            break
        if bool(done.any()):
            keep = (~done).nonzero()[:, 0]  # [b'']
            for layer in cache.layers:
                layer.batch_select_indices(keep)
            alive, tok, last_pos, mask = alive[keep], tok[keep], last_pos[keep], mask[keep]
        mask = torch.cat([mask, torch.ones(len(alive), 1, dtype=torch.long)], 1)  # [b', L+step+1]
        last_pos = last_pos + 1
        h = model.model(input_ids=tok[:, None], attention_mask=mask, position_ids=last_pos[:, None], cache=cache,
                        use_cache=True).last_hidden_state  # [b', 1, H]
        last_h = h[:, 0]
        for j, b in enumerate(alive.tolist()):
            feats[b].append(h[j].to(torch.float16))
    rows = []
    for b, p in enumerate(prompt_ids):
        tokens = torch.tensor(list(p) + new[b], dtype=torch.int32)  # [L_b]
        f = torch.cat(feats[b], 0)[: len(tokens) - 1]  # [L_b - 1, H]
        rows.append({"tokens": tokens, "feats": f, "n_prompt": len(p)})
    return rows
