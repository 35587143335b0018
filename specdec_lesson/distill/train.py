"""Training the EAGLE-style draft on teacher shards: the loss (training-time test), batching, checkpoints.

Stages 1 and 2 of the shipped draft were made with (on the 2-core CPU: the data commands ran side by side with 1 thread each,
then train alone with 2 threads)::

    python -m specdec_lesson.distill gen --max-shards 14             # 224 answers, 50k positions (session 1)
    python -m specdec_lesson.distill gen --seed 1 --n-code 600 --n-math 600 --batch 32 --max-new 256 --max-shards 26
    python -m specdec_lesson.distill corpus --n 4600 --max-shards 36  # 2304 real functions, 562k positions
    python -m specdec_lesson.distill heldout --n-code 10 --n-math 10
    python -m specdec_lesson.distill train --steps 1200 --budget 4096 --lr 1e-3 --n-sub 4096 --unroll 2 \
        --ckpt-every 50 --val-every 100 --threads 2
    python -m specdec_lesson.distill export --curve-every 2 --n-sub 8192 --force

That was stage 1 (git revision dff1e6e ships it).  Stage 2 (session 5) trained it further on the target's own
answers, kept as token ids in the repository, their features recomputed (1664 answers in 26 batches of 64, then
``features`` over both shipped answer files, 424k positions, about 17 minutes; training 48 minutes, two runs side by
side with 1 thread each; ``--arch eagle3`` with the same flags and no ``--init`` is the EAGLE-3 run beside it)::

    python -m specdec_lesson.distill answers --file specdec_lesson/data/answers_smollm2_more.npz --n-code 1269 \
        --n-math 1231 --batch 64 --max-new 160 --seed 3 --max-batches 26 --threads 2 --force
    python -m specdec_lesson.distill heldout --out runs/s5 --n-code 10 --n-math 10 --threads 2
    python -m specdec_lesson.distill features --out runs/s5 --threads 2    # aux layers 2,15,27 for an eagle3 draft
    cp specdec_lesson/data/eagle_smollm2.json runs/stage1.json             # the stage-1 draft's record
    python -m specdec_lesson.distill train --out runs/s5 --init specdec_lesson/data --steps 1100 --budget 2048 \
        --lr 5e-4 --n-sub 4096 --unroll 4 --ckpt-every 100 --val-every 100 --bf16 --threads 1
    python -m specdec_lesson.distill export --out runs/s5 --n-sub 8192 --curve-every 2 --init-json runs/stage1.json \
        --force

``benchmarks/draft_vocab.py`` then scored that draft over subsets of N = 1024 .. 49152 tokens (alpha flat, the head's
cost not), and the shipped draft carries the 2048 most frequent reply tokens of the shipped answers (session 8)::

    python -m specdec_lesson.distill resubset --n-sub 2048 --heldout runs/s5/heldout.pt --force
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from .teacher import _teacher, atomic_save, load_file, load_shards, shard_paths

__all__ = ["run_train", "draft_loss", "choose_subset", "init_from_target", "remove_stale_temps"]


def choose_subset(rows: list[dict], n_sub: int, vocab: int, always: tuple[int, ...] = ()) -> torch.Tensor:
    """The ``n_sub`` most frequent response tokens (then prompt tokens, then lowest ids), sorted by id."""
    counts = torch.zeros(vocab, dtype=torch.float64)
    for r in rows:
        t = r["tokens"].long()
        counts.index_add_(0, t[r["n_prompt"]:], torch.ones(len(t) - r["n_prompt"], dtype=torch.float64))
        counts.index_add_(0, t[: r["n_prompt"]], torch.full((r["n_prompt"],), 1e-3, dtype=torch.float64))
    counts[list(always)] = 1e9
    counts -= torch.arange(vocab, dtype=torch.float64) * 1e-9  # ties -> lower id
    return torch.topk(counts, min(n_sub, vocab)).indices.sort().values


def _batches(rows: list[dict], budget: int, gen: torch.Generator) -> list[list[int]]:
    """Length-sorted batches of at most ``budget`` padded positions, in a seeded random order."""
    order = sorted(range(len(rows)), key=lambda i: len(rows[i]["tokens"]))
    out, cur, cur_max = [], [], 0
    for i in order:
        n = len(rows[i]["tokens"])
        if cur and max(cur_max, n) * (len(cur) + 1) > budget:
            out.append(cur)
            cur, cur_max = [], 0
        cur.append(i)
        cur_max = max(cur_max, n)
    if cur:
        out.append(cur)
    return [out[j] for j in torch.randperm(len(out), generator=gen).tolist()]


def _collate(rows: list[dict], idx: list[int], prompt_weight: float, inputs: str = "feats"):
    """-> inputs [B, T, H or n_aux * H] (f_0.. or the aux streams), tokens [B, T] (x_1..), targets [B, T, H] (f_1..),
    weight [B, T]."""
    T = max(len(rows[i]["tokens"]) for i in idx) - 2
    H, W = rows[idx[0]]["feats"].shape[1], rows[idx[0]][inputs].shape[1]
    feats = torch.zeros(len(idx), T + 1, H)
    src = feats if inputs == "feats" else torch.zeros(len(idx), T, W)
    tokens = torch.zeros(len(idx), T, dtype=torch.long)
    weight = torch.zeros(len(idx), T)
    for b, i in enumerate(idx):
        r = rows[i]
        n = len(r["tokens"]) - 2
        feats[b, : n + 1] = r["feats"].float()
        if inputs != "feats":
            src[b, :n] = r[inputs][:n].float()
        tokens[b, :n] = r["tokens"][1 : n + 1].long()
        weight[b, :n] = 1.0
        weight[b, : max(0, r["n_prompt"] - 2)] = prompt_weight  # predicting prompt tokens (t + 2 < n_prompt)
    return src[:, :T], tokens, feats[:, 1:], weight


def draft_loss(model, feats, tokens, targets, weight, steps: int, reg_weight: float = 0.1, decay: float = 0.8):
    """Soft cross-entropy to the target's law on the subset (+ feature regression when ``reg_weight``), summed over
    unrolled steps with weights ``decay ** s``.  Returns (loss, per-step top-1 agreement list)."""
    with torch.no_grad():
        teacher = torch.softmax(targets @ model.head.T, -1)  # [B, T, N] the target's law on the subset
        top = teacher.argmax(-1)  # [B, T]
    wsum = weight.sum().clamp(min=1e-6)
    loss, acc = 0.0, []
    for s, g in enumerate(model.forward_train(feats, tokens, steps)):
        logp = torch.log_softmax(model.logits(g), -1)  # [B, T, N]
        ce = -(teacher * logp).sum(-1)  # [B, T]
        if reg_weight:
            ce = ce + reg_weight * F.smooth_l1_loss(g, targets, reduction="none").mean(-1)  # [B, T]
        loss = loss + decay**s * ((ce * weight).sum() / wsum)
        acc.append(float(((logp.argmax(-1) == top).float() * (weight > 0)).sum() / (weight > 0).sum().clamp(min=1)))
    return loss, acc


def init_from_target(model, target, generator: torch.Generator | None = None) -> None:
    """Start the draft layer from the target's LAST decoder layer (and its final norm); a draft with a wider MLP than
    the target's (``--intermediate``) gets the target's units first and new ones that output zero (``widen_mlp_state``)."""
    from ..drafters.eagle_model import widen_mlp_state

    layer = target.model.layers[-1]
    a, m = layer.self_attn, layer.mlp
    mlp = {"gate_up.weight": torch.cat([m.gate_proj.weight, m.up_proj.weight], 0), "down.weight": m.down_proj.weight}
    if model.cfg["intermediate"] != m.down_proj.weight.shape[1]:
        mlp = widen_mlp_state(mlp, model.cfg["intermediate"], generator or torch.Generator().manual_seed(0))
    with torch.no_grad():
        model.qkv.weight.copy_(torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight], 0))
        model.o.weight.copy_(a.o_proj.weight)
        model.gate_up.weight.copy_(mlp["gate_up.weight"])
        model.down.weight.copy_(mlp["down.weight"])
        model.norm_in.copy_(layer.input_layernorm.weight)
        model.norm_mlp.copy_(layer.post_attention_layernorm.weight)
        model.norm_out.copy_(target.model.norm.weight)


def _load_init(model, init: Path, generator: torch.Generator | None = None) -> None:
    """Trained weights from a shipped draft folder (``*.safetensors``) or a ``draft_*.pt``; ValueError if they do not fit.
    A draft with a narrower MLP than ``model`` is widened first (``widen_mlp_state``: the same function at step 0)."""
    from ..drafters.eagle_model import widen_mlp_state

    if init.is_dir():
        from safetensors.torch import load_file as load_st

        files = sorted(init.glob("*.safetensors"))
        if len(files) != 1:
            raise ValueError(f"--init folder {init} must hold one draft .safetensors file, found {len(files)}")
        state = load_st(str(files[0]))
    else:
        state = load_file(init, "the --init draft", "pass a draft folder or a draft_*.pt checkpoint")
    state = {k: v.float() if v.is_floating_point() else v for k, v in state.items() if k != "d2t"}
    inter = model.cfg.get("intermediate")
    if "down.weight" in state and inter is not None and state["down.weight"].shape[1] < inter:
        state = widen_mlp_state(state, inter, generator or torch.Generator().manual_seed(0))
    own = model.state_dict()
    bad = [k for k, v in state.items() if k not in own or own[k].shape != v.shape]
    bad += [k for k in own if k != "d2t" and k not in state]
    if bad:
        width = state["down.weight"].shape[1] if "down.weight" in state else None
        hint = f"; it has {width} MLP units: pass --intermediate {width}" if width not in (None, inter) else ""
        raise ValueError(f"--init {init} does not fit this draft (arch {model.cfg.get('arch', 'eagle')}): {bad[:3]} differ{hint}")
    model.load_state_dict({**state, "d2t": model.d2t})


STALE_TEMP_S = 3600.0  # a temporary file this old is stale whatever its pid (pids are reused)


def remove_stale_temps(*folders: Path) -> list[Path]:
    """Remove the temporary files ``.<name>.tmp-<pid>`` (``teacher.atomic_save``) that a killed process left (SIGKILL
    runs no ``finally``): those whose pid no longer runs, or older than an hour; a running process's stay."""
    from ..model_cache import _pid_alive

    removed = []
    for folder in folders:
        for p in Path(folder).glob(".*.tmp-*"):
            pid = p.name.rsplit(".tmp-", 1)[1]
            try:
                old = time.time() - p.stat().st_mtime > STALE_TEMP_S
            except OSError:  # removed meanwhile
                continue
            if not pid.isdigit() or int(pid) == os.getpid() or (_pid_alive(int(pid)) and not old):
                continue
            try:
                p.unlink()
                removed.append(p)
            except OSError:
                pass
    return removed


def _lr(step: int, total: int, lr: float, warmup: int) -> float:
    if step < warmup:
        return lr * (step + 1) / warmup
    t = min(1.0, (step - warmup) / max(1, total - warmup))
    return lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))


def _check_resume(path: Path, ckpt: dict, made: dict) -> None:
    """A resumed run must use the settings that made the checkpoint (``--steps`` may change: training further)."""
    if not isinstance(ckpt, dict) or not {"model", "opt", "step", "log", "d2t"} <= set(ckpt):
        raise ValueError(f"{path} is not a training checkpoint of this trainer; delete it to train again from step 0")
    old = ckpt.get("made")
    if old is None:
        return  # older checkpoint: the shape comparison after the target is loaded still catches --fast
    diff = [k for k in made if old.get(k) != made[k]]
    if not diff:
        return
    if "fast" in diff:
        was = "with --fast (the tiny random target)" if old["fast"] else "without --fast (the real target)"
        raise ValueError(f"{path} was made {was}, and this run is {'with' if made['fast'] else 'without'} --fast; rerun "
                         f"{'with' if old['fast'] else 'without'} --fast, or use another --out (or delete it) to start over")
    flags = ", ".join(f"--{k.replace('_', '-')} {old.get(k)} (this run: {made[k]})" for k in diff)
    raise ValueError(f"{path} was made with {flags}; a resume must use the same settings to equal an uninterrupted run: "
                     "rerun with them, or use another --out (or delete it) to start over")


def run_train(out: Path, total_steps: int, budget: int = 3072, lr: float = 6e-4, n_sub: int = 6144, unroll: int = 2,
              seed: int = 0, fast: bool = False, ckpt_every: int = 50, val_every: int = 50, progress: bool = True,
              stop_after: int | None = None, prompt_weight: float = 0.5, reload: bool = False, arch: str = "eagle",
              decay: float = 0.8, init: Path | None = None, aux_layers: tuple[int, ...] | None = None,
              bf16: bool = False, intermediate: int | None = None) -> dict:
    """Train (or resume) the draft on ``out/data``; checkpoint to ``out/ckpt.pt``; returns the checkpoint dict.
    A killed run's temporary checkpoint files are removed at the start (``remove_stale_temps``).
    ``stop_after`` ends the call early (as an interruption would) without changing the schedule.  ``reload``
    appends shards that appeared since (a gen still running) at each epoch start; a resume is then exact only
    if no shard appeared meanwhile.  ``arch`` is ``"eagle"`` (last hidden state in, feature regression) or
    ``"eagle3"`` (``aux_layers`` fused, no regression); ``init`` a draft folder or ``draft_*.pt`` of the same arch
    to start from (its trained weights; the output subset is this run's).  ``bf16`` runs forward and backward under
    bfloat16 autocast (fp32 weights and optimizer; about 2.5x faster on CPUs with AVX512-BF16 or AMX).
    ``intermediate`` sets the draft layer's MLP width (default: the target's); a narrower ``init`` is widened."""
    from tqdm import tqdm

    from ..drafters.eagle import EagleConfig, _target_tables, draft_class
    from ..drafters.eagle3 import default_aux_layers, eagle3_config, init_eagle3_from_target

    if arch not in ("eagle", "eagle3"):
        raise ValueError(f"arch must be 'eagle' or 'eagle3', got {arch!r}")

    if not shard_paths(out):  # before loading the target
        raise ValueError(f"no teacher data under {out / 'data'} (no shard_*.pt); run the gen (or corpus) command with "
                         "the same --out first")
    remove_stale_temps(out, out / "ckpts")  # a killed run's half-written checkpoints
    ckpt_path = out / "ckpt.pt"
    made = {"fast": bool(fast), "n_sub": n_sub, "budget": budget, "lr": lr, "unroll": unroll, "seed": seed,
            "prompt_weight": prompt_weight}
    if arch != "eagle" or decay != 0.8 or init is not None or bf16:  # recorded only when set: older checkpoints resume
        made.update(arch=arch, decay=decay, init=None if init is None else Path(init).name, bf16=bf16)
    if intermediate is not None:
        made["intermediate"] = intermediate
    ckpt = load_file(ckpt_path, "the checkpoint", "delete it to train again from step 0") if ckpt_path.exists() else None
    if ckpt is not None:
        _check_resume(ckpt_path, ckpt, made)
    torch.manual_seed(seed)  # nothing random is drawn below; model init is overwritten or seeded here
    target, _ = _teacher(fast, seed)
    rows = load_shards(out)
    if arch == "eagle3":
        aux_layers = tuple(aux_layers or default_aux_layers(target.config.num_hidden_layers))
        bad = next((r for r in rows if r.get("aux_layers") != list(aux_layers)), None)
        if bad is not None:
            raise ValueError(f"the eagle3 draft needs every teacher row's aux features for target layers {list(aux_layers)}; "
                             f"a row ({bad.get('source', 'gen')}) has {bad.get('aux_layers')}: run features with "
                             f"--aux-layers {','.join(map(str, aux_layers))} on an --out holding only its shards")
    val = [r for i, r in enumerate(rows) if i % 25 == 24] or rows[-2:]
    train = [r for i, r in enumerate(rows) if i % 25 != 24] or rows
    V = target.get_input_embeddings().weight.shape[0]
    eos = target.config.eos_token_id if target.config.eos_token_id is not None else 2
    d2t = ckpt["d2t"] if ckpt else choose_subset(train, n_sub, V, always=(eos,))
    cfg = eagle3_config(target, len(d2t), aux_layers) if arch == "eagle3" else EagleConfig.from_target(target, len(d2t))
    if intermediate is not None:
        cfg["intermediate"] = intermediate
    model = draft_class(cfg)(cfg, *_target_tables(target), d2t=d2t)
    if ckpt and dict(ckpt.get("config", {})) != dict(model.cfg):  # a checkpoint from before ``made`` was recorded
        old_cfg = ckpt.get("config") or {}
        diff = ", ".join([f"{k} {old_cfg.get(k)} (this run: {v})" for k, v in model.cfg.items() if old_cfg.get(k) != v][:2])
        raise ValueError(f"{ckpt_path} was made for another target or draft shape ({diff}): probably made "
                         f"{'without' if fast else 'with'} --fast; rerun {'without' if fast else 'with'} --fast, or use "
                         "another --out (or delete it) to start over")
    if arch == "eagle3":
        init_eagle3_from_target(model, target)
    else:
        init_from_target(model, target, torch.Generator().manual_seed(seed))
    if init is not None and not ckpt:
        _load_init(model, Path(init), torch.Generator().manual_seed(seed + 1))
    inputs = "aux" if arch == "eagle3" else "feats"
    reg_weight = 0.1 if arch == "eagle" else 0.0
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    step, log = 0, []
    if ckpt:
        model.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["opt"])
        step, log = ckpt["step"], ckpt["log"]
    epochs: list[list] = []
    seen_rows = [len(rows)]

    def batch_at(i: int):
        while i >= sum(len(b) for b in epochs):
            if reload and epochs:  # new shards written since (gen still running): append their rows
                more = load_shards(out)[seen_rows[0]:]
                seen_rows[0] += len(more)
                train.extend(r for j, r in enumerate(more, start=seen_rows[0] - len(more)) if j % 25 != 24)
            epochs.append(_batches(train, budget, torch.Generator().manual_seed(seed + 1000 * len(epochs))))
        for b in epochs:
            if i < len(b):
                return b[i]
            i -= len(b)

    def validate() -> list[float]:
        model.eval()
        tot, n = None, 0
        with torch.no_grad():
            for vb in _batches(val, budget, torch.Generator().manual_seed(0)):
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                    _, acc = draft_loss(model, *_collate(val, vb, 0.0, inputs), steps=unroll, reg_weight=reg_weight,
                                        decay=decay)
                tot = acc if tot is None else [a + b for a, b in zip(tot, acc)]
                n += 1
        model.train()
        return [round(a / max(1, n), 4) for a in (tot or [])]

    model.train()
    t0 = time.time()
    bar = tqdm(total=total_steps, initial=step, desc="train", disable=not progress)
    end = total_steps if stop_after is None else min(total_steps, step + stop_after)
    while step < end:
        for gr in opt.param_groups:
            gr["lr"] = _lr(step, total_steps, lr, max(1, total_steps // 20))
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss, acc = draft_loss(model, *_collate(train, batch_at(step), prompt_weight, inputs), steps=unroll,
                                   reg_weight=reg_weight, decay=decay)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        step += 1
        bar.update(1)
        bar.set_postfix(loss=f"{loss.item():.3f}", acc=",".join(f"{a:.2f}" for a in acc))
        entry = {"step": step, "loss": round(loss.item(), 4), "train_acc": [round(a, 4) for a in acc]}
        if step % val_every == 0 or step == total_steps:
            entry["val_acc"] = validate()
            entry["seconds"] = round(time.time() - t0, 1)
        log.append(entry)
        if step % ckpt_every == 0 or step == end:
            ckpt = {"model": model.state_dict(), "opt": opt.state_dict(), "step": step, "log": log, "d2t": d2t,
                    "config": dict(model.cfg), "seed": seed, "positions": sum(len(r["tokens"]) for r in train), "made": made}
            atomic_save(ckpt, ckpt_path)
            if step % ckpt_every == 0:
                atomic_save(model.state_dict(), out / "ckpts" / f"draft_{step:06d}.pt")
    bar.close()
    return {"model": model.state_dict(), "step": step, "log": log, "d2t": d2t, "draft": model}
