"""A draft trained in minutes on this CPU: notebook 08's lab.

The shipped draft took hours of teacher data and training.  This is the same recipe, cut down so that a learner can
watch it work: a fresh one-layer EAGLE-style draft (started from the target's last layer, as ``distill train``
starts) is trained on the target's own features for a few hundred steps, and every ``eval_every`` steps its greedy
acceptance is replayed on held-out answers (:func:`~specdec_lesson.distill.evaluate.offline_alpha`).

* :func:`lab_rows` - teacher rows from the shipped token ids (the mixture shards in ``specdec_lesson/data/mixture``:
  chat, Magpie questions, code and math answers of the target): tokens, the target's last hidden states (one
  forward of the target per row) and the answer's kind.  Training rows and held-out rows are disjoint: held-out rows
  come from the last shard of seed 0, training rows from its other shards (the lab reads seed 0 alone, so that its
  rows stay the same when later seeds' shards are added).
* :func:`train_lab` - the training loop with one knob per argument (``n_train`` rows, ``unroll`` steps, ``n_sub``
  vocabulary subset, ``steps``); returns the loss and the held-out alpha at each evaluation.

The loss is :func:`~specdec_lesson.distill.train.draft_loss`: for each unrolled step s (the draft feeding itself
its own features s times), the soft cross-entropy between the target's next-token law p on the subset and the draft's
q, plus 0.1 x a smooth-L1 regression of the draft's feature onto the target's, weighted by decay^s.
"""

from __future__ import annotations

import time

import torch

__all__ = ["lab_rows", "train_lab"]


def _shard_rows(path, max_len: int) -> list[dict]:
    from ..drafters.suffix import load_answer_corpus

    rows = load_answer_corpus(path)[0]
    return [r for r in rows if r["n_prompt"] >= 2 and r["n_prompt"] + 8 <= min(len(r["tokens"]), max_len)]


@torch.no_grad()  # not inference_mode: the features become training inputs
def lab_rows(target, n_train: int, n_held: int, *, max_len: int = 192, seed: int = 0, budget: int = 4096,
             progress=None) -> tuple[list[dict], list[dict]]:
    """``(train, held)`` teacher rows for the lab: ``n_train`` rows drawn (seeded) from every seed-0 mixture shard but
    the last, ``n_held`` from the last (each row cut to ``max_len`` tokens).  ``progress(done, total)`` is called after
    each batch of target forwards (one forward per row, in batches of about ``budget`` positions)."""
    from .mixture import mixture_files
    from .teacher import forward_in_batches

    if n_train < 1 or n_held < 1:
        raise ValueError(f"n_train and n_held must be >= 1, got {n_train} and {n_held}")
    files = [f for f in mixture_files() if f.name.startswith("mix_0_")]  # seed 0: fixed as later seeds are added
    if len(files) < 2:
        raise ValueError("the lab needs the shipped mixture shards (specdec_lesson/data/mixture/mix_*.npz); reinstall "
                         "the package from the repository (pip install -e .)")
    g = torch.Generator().manual_seed(seed)
    pool = [r for f in files[:-1] for r in _shard_rows(f, max_len)]
    held_pool = _shard_rows(files[-1], max_len)
    if n_train > len(pool) or n_held > len(held_pool):
        raise ValueError(f"asked for {n_train} training and {n_held} held-out rows; the shards hold {len(pool)} and "
                         f"{len(held_pool)} usable rows")
    picks = [pool[i] for i in torch.randperm(len(pool), generator=g)[:n_train].tolist()]
    held_picks = [held_pool[i] for i in torch.randperm(len(held_pool), generator=g)[:n_held].tolist()]
    out = []
    todo = picks + held_picks
    step = max(1, budget // max_len)
    for i in range(0, len(todo), step):
        chunk = todo[i: i + step]
        made = forward_in_batches(target, [r["tokens"][:max_len] for r in chunk], [r["n_prompt"] for r in chunk], budget)
        for r, src in zip(made, chunk):
            r["kind"] = src["kind"]
        out += made
        if progress is not None:
            progress(len(out), len(todo))
    return out[:n_train], out[n_train:]


def train_lab(target, train: list[dict], held: list[dict], *, steps: int = 300, unroll: int = 2, n_sub: int = 2048,
              lr: float = 1e-3, budget: int = 2048, eval_every: int = 50, k: int = 4, seed: int = 0,
              progress=None) -> dict:
    """Train a fresh draft on ``train`` for ``steps`` steps (AdamW, ``budget`` padded positions per step); evaluate
    held-out greedy acceptance (``offline_alpha``, chains of ``k``) before the first step and every ``eval_every``.
    Returns ``{"log": [{"step", "loss", "top1"}], "evals": [{"step", "alpha_tok", "tau", "by_kind"}], "seconds",
    "settings"}``; ``progress(step, steps, last_eval)`` is called after each evaluation."""
    from ..drafters.eagle import EagleConfig, EagleDrafter, _target_tables, draft_class
    from .evaluate import offline_alpha
    from .train import _batches, _collate, choose_subset, draft_loss, init_from_target

    if steps < 1 or unroll < 1 or n_sub < 2 or eval_every < 1 or k < 1:
        raise ValueError(f"steps, unroll, eval_every and k must be >= 1 and n_sub >= 2; got steps={steps}, "
                         f"unroll={unroll}, n_sub={n_sub}, eval_every={eval_every}, k={k}")
    if not train or not held:
        raise ValueError("train_lab needs training rows and held-out rows (lab_rows makes both)")
    torch.manual_seed(seed)  # the draft's fresh parameters (the parts not copied from the target)
    V = target.get_input_embeddings().weight.shape[0]
    eos = target.config.eos_token_id if target.config.eos_token_id is not None else 2
    d2t = choose_subset(train, n_sub, V, always=(eos,))
    cfg = EagleConfig.from_target(target, len(d2t))
    model = draft_class(cfg)(cfg, *_target_tables(target), d2t=d2t)
    init_from_target(model, target)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr, betas=(0.9, 0.95),
                            weight_decay=0.0)
    gen = torch.Generator().manual_seed(seed)
    log, evals, batches = [], [], []
    t0 = time.perf_counter()

    def evaluate(step: int) -> None:
        model.eval()
        with torch.inference_mode():
            res = offline_alpha(EagleDrafter(model), held, k)
        model.train()
        evals.append({"step": step, "alpha_tok": res["all"]["alpha_tok"], "tau": res["all"]["tau"],
                      "by_kind": {kd: v["alpha_tok"] for kd, v in res.items() if kd != "all"}})
        if progress is not None:
            progress(step, steps, evals[-1])

    evaluate(0)
    for step in range(1, steps + 1):
        if not batches:
            batches = _batches(train, budget, gen)
        feats, tokens, targets, weight = _collate(train, batches.pop(), prompt_weight=0.5)
        loss, acc = draft_loss(model, feats, tokens, targets, weight, unroll)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        log.append({"step": step, "loss": float(loss.detach()), "top1": acc[0]})
        if step % eval_every == 0 or step == steps:
            evaluate(step)
    return {"log": log, "evals": evals, "seconds": time.perf_counter() - t0, "model": model,
            "settings": {"n_train": len(train), "n_held": len(held), "steps": steps, "unroll": unroll, "n_sub": n_sub,
                         "lr": lr, "budget": budget, "k": k}}
