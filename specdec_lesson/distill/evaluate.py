"""Scoring the distilled draft without the target's cost, and shipping it.

``run_heldout`` records the target's greedy answers (with features) to the benchmark's EVALUATION prompts
once; ``offline_alpha`` replays any draft checkpoint on them (exactly the drafts a greedy speculative run
would make, with no target forward); ``run_export`` writes the shipped weights and the alpha-per-checkpoint
curve used by notebook 08.  Nothing here is trained on the evaluation prompts.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from .data import chat_text
from .teacher import _teacher, atomic_save, generate_teacher, load_file

__all__ = ["run_heldout", "offline_alpha", "run_export"]

def run_heldout(out: Path, n_code: int, n_math: int, max_new: int, batch: int = 16, n_requests: int = 0,
                n_chat: int = 0) -> Path:
    """Target greedy responses (+ features) to the benchmark's EVALUATION prompts, for offline alpha only
    (never trained on): HumanEval 82.., ``bench.tasks.math_problems("eval")``, and the first ``n_requests`` /
    ``n_chat`` items of the held-out function-request and chat tasks (``bench.tasks.task_items``)."""
    from ..bench.tasks import code_problems, format_code_prompt, format_math_prompt, math_problems, task_items

    for name, n in (("n_code", n_code), ("n_math", n_math), ("n_requests", n_requests), ("n_chat", n_chat),
                    ("max_new", max_new - 1), ("batch", batch - 1)):
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"{name} must be an integer >= {0 if name.startswith('n_') else 1}")
    path = out / "heldout.pt"
    if path.exists():
        return path
    model, tok = _teacher(False, 0)
    items = [("code", format_code_prompt(p)) for p in code_problems("eval")[:n_code]]
    items += [("math", format_math_prompt(p)) for p in math_problems("eval")[:n_math]]
    items += [(task, it["text"]) for task, n in (("requests", n_requests), ("chat", n_chat))
              for it in (task_items(task)[:n] if n else [])]
    prompts = [tok(chat_text(tok, t), add_special_tokens=False)["input_ids"] for _, t in items]
    rows = []
    for i in range(0, len(prompts), batch):
        rows += generate_teacher(model, prompts[i:i + batch], max_new, 0.0, torch.Generator(), tok.eos_token_id,
                                 tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id)
    for r, (k, _) in zip(rows, items):
        r["kind"] = k
    atomic_save(rows, path)
    return path


@torch.no_grad()
def offline_alpha(drafter, rows: list[dict], k: int = 4) -> dict:
    """Greedy chain acceptance of ``drafter`` replayed on fixed target greedy sequences (teacher-forced features):
    exactly the drafts a greedy speculative run would make, up to float noise in the features.
    Returns {"alpha", "alpha_tok", "tau"} per kind and overall."""
    from ..sampling import SamplingConfig

    greedy = SamplingConfig(0.0)
    acc: dict[str, list[int]] = {}
    key = "aux" if getattr(drafter, "target_hidden_layers", None) else "feats"  # what the engine would pass
    for r in rows:
        if key == "aux" and r.get("aux_layers") != list(drafter.target_hidden_layers):
            raise ValueError(f"a held-out row lacks aux features for layers {list(drafter.target_hidden_layers)} "
                             "(distill.features.add_aux makes them)")
        toks, feats, n0 = r["tokens"].long(), r[key].float(), r["n_prompt"]
        drafter.begin(toks[None, :n0], torch.ones(1, n0, dtype=torch.bool), feats[None, : n0 - 1])
        pos = n0 - 1  # index of the pending token
        while pos + 1 < len(toks):
            kk = min(k, len(toks) - pos - 1)
            drafts, _ = drafter.propose(kk, greedy, None)
            drafts = drafts[0, : len(toks) - pos - 1]  # a drafter may propose fewer (or more) than k
            kk = len(drafts)
            truth = toks[pos + 1: pos + 1 + kk]
            match = (drafts == truth).long().cumprod(0)
            n = int(match.sum())
            nxt = pos + n + 1
            stats = acc.setdefault(r.get("kind", "all"), [0, 0, 0, 0])
            stats[0] += n
            stats[1] += kk
            stats[2] += 1
            stats[3] += n < kk  # a rejection ended this chain
            if nxt >= len(toks):
                break
            f = feats[pos: pos + kk + 1]
            f = torch.cat([f, f.new_zeros(kk + 1 - len(f), f.shape[1])]) if len(f) < kk + 1 else f
            drafter.commit(torch.tensor([n]), toks[nxt: nxt + 1], f[None])
            pos = nxt
    def summary(a: int, d: int, s: int, rej: int) -> dict:
        # alpha: accepted / proposed drafts (SpecStats' definition); alpha_tok: per-token acceptance rate (Leviathan's
        # alpha, the geometric MLE accepted / (accepted + rejections)); tau: tokens per target forward
        return {"alpha": round(a / max(1, d), 4), "alpha_tok": round(a / max(1, a + rej), 4),
                "tau": round((a + s) / max(1, s), 3)}

    res = {kind: summary(*v) for kind, v in acc.items()}
    res["all"] = summary(*[sum(v[i] for v in acc.values()) for i in range(4)])
    return res


def _load_weights(model, state: dict) -> None:
    """Trained weights only: the output subset ``d2t`` stays the model's own (see ``export_subset``)."""
    model.load_state_dict({**state, "d2t": model.d2t})


def checkpoint_alpha(out: Path, ckpt_file: Path, model, held: list[dict], k: int) -> dict:
    """offline_alpha of a saved checkpoint, cached in ``out/alpha_cache`` (so it can be computed while training runs)."""
    from ..drafters.eagle import EagleDrafter

    cache = out / "alpha_cache" / f"{ckpt_file.stem}_k{k}_n{len(model.d2t)}.json"
    if cache.exists():
        return json.loads(cache.read_text())
    _load_weights(model, torch.load(ckpt_file))
    res = offline_alpha(EagleDrafter(model), held, k)
    cache.parent.mkdir(parents=True, exist_ok=True)
    tmp = cache.with_name(cache.name + ".tmp")
    tmp.write_text(json.dumps(res))
    tmp.replace(cache)
    return res


def export_subset(rows: list[dict], tokenizer, n_sub: int, vocab: int, eos: int) -> torch.Tensor:
    """The shipped output subset: tokens of the target's training answers (by count), then of the training prompts,
    then of standard-library source text (code and English docstrings), ties to the lowest id; sorted by id.
    The draft's trained weights do not depend on the subset (its head is the target's frozen output layer), so the
    subset can be wider than the one used for the training loss."""
    import sysconfig

    resp = torch.zeros(vocab, dtype=torch.float64)
    prm = torch.zeros(vocab, dtype=torch.float64)
    for r in rows:
        t, n = r["tokens"].long(), r["n_prompt"]
        resp.index_add_(0, t[n:], torch.ones(len(t) - n, dtype=torch.float64))
        prm.index_add_(0, t[:n], torch.ones(n, dtype=torch.float64))
    corpus = torch.zeros(vocab, dtype=torch.float64)
    files = sorted(p for p in Path(sysconfig.get_paths()["stdlib"]).rglob("*.py") if "site-packages" not in p.parts)
    for p in files[::3]:
        try:
            ids = tokenizer(p.read_text(encoding="utf-8")[:50000], add_special_tokens=False)["input_ids"]
        except (UnicodeDecodeError, OSError):
            continue
        corpus.index_add_(0, torch.tensor(ids, dtype=torch.long), torch.ones(len(ids), dtype=torch.float64))
    score = resp * 1e12 + prm * 1e6 + corpus
    score[eos] = float("inf")
    order = torch.argsort(score - torch.arange(vocab, dtype=torch.float64) * 1e-9, descending=True, stable=True)
    return order[:n_sub].sort().values


def draft_files(folder: Path) -> list[Path]:
    """The draft files (``eagle_smollm2*``) a folder holds, sorted."""
    from ..drafters.eagle import DEFAULT_DRAFT_NAME

    return sorted(p for p in Path(folder).glob(f"{DEFAULT_DRAFT_NAME}*") if p.is_file())


def check_draft_dest(dest: Path, force: bool, cmd: str, src: Path | None = None) -> None:
    """One UsageError naming the fix, before any model is loaded, unless ``cmd`` may write a draft into ``dest``:
    replacing the shipped draft, or a draft already in another folder than ``src``, needs ``force``."""
    from ..cli_args import UsageError, same_file
    from ..drafters.eagle import DEFAULT_DRAFT_DIR

    if force:
        return
    if same_file(dest, DEFAULT_DRAFT_DIR):
        raise UsageError(f"{cmd} would rewrite the shipped draft in {dest}: add --force to do so (the replaced files "
                         "are copied to a backup folder under --out first), or write the draft to another folder with "
                         "--dest DIR")
    if not (src is not None and same_file(dest, src)) and draft_files(dest):
        raise UsageError(f"--dest {dest} already holds a draft ({draft_files(dest)[0].name}): add --force to replace "
                         "it, or choose another --dest")


def backup_draft(dest: Path, backup: Path | None) -> str | None:
    """Copy the draft files ``dest`` holds into ``backup``, a new folder (never over an earlier backup)."""
    import shutil

    if backup is None or not draft_files(dest):
        return None
    Path(backup).mkdir(parents=True, exist_ok=False)
    for f in draft_files(dest):
        shutil.copy2(f, Path(backup) / f.name)
    return str(backup)


def run_export(out: Path, dest: Path | None = None, k: int = 4, step: int | None = None, curve_every: int = 1,
               n_sub: int | None = None, init_meta: dict | None = None, *, force: bool = False,
               backup: Path | None = None) -> dict:
    """Checkpoint ``step`` (default: the last) -> fp16 weights + config in ``dest`` (default: the shipped draft's
    folder; replacing a draft there needs ``force``, ``check_draft_dest``, and ``backup``, a new folder, receives
    the replaced files first); offline held-out alpha of every ``curve_every``-th saved checkpoint -> curve JSON
    (``*_curve.json``)."""
    from ..drafters.eagle import (
        DEFAULT_DRAFT_DIR,
        DEFAULT_DRAFT_NAME,
        EagleConfig,
        EagleDrafter,
        _target_tables,
        draft_class,
        save_draft,
    )

    dest = Path(dest or DEFAULT_DRAFT_DIR)
    check_draft_dest(dest, force, "export")
    ckpt = load_file(out / "ckpt.pt", "the checkpoint", "run train with the same --out first")
    fast_made = (f"{out / 'ckpt.pt'} was trained with --fast on the tiny random target; only a checkpoint of the real "
                 "target can be exported (it would replace the shipped draft)")
    if not isinstance(ckpt, dict) or not {"model", "step", "log", "d2t", "config", "seed"} <= set(ckpt):
        raise ValueError(f"{out / 'ckpt.pt'} is not a training checkpoint of distill.train; run train with this --out")
    if (ckpt.get("made") or {}).get("fast"):
        raise ValueError(fast_made)
    saved = sorted((out / "ckpts").glob("draft_*.pt"))
    chosen = out / "ckpts" / f"draft_{(step or ckpt['step']):06d}.pt"
    if step is not None and not chosen.exists():
        have = ", ".join(str(int(p.stem.split("_")[1])) for p in saved) or "none"
        raise ValueError(f"no saved checkpoint for --step {step} in {out / 'ckpts'} (saved steps: {have})")
    target, tok = _teacher(False, 0)
    if (ckpt.get("config") or {}).get("hidden") != target.config.hidden_size:  # a --fast checkpoint of older code
        raise ValueError(fast_made)
    d2t = ckpt["d2t"]
    if n_sub:
        from .teacher import load_shards

        d2t = export_subset(load_shards(out), tok, n_sub, target.config.vocab_size, tok.eos_token_id)
    cfg = EagleConfig(ckpt["config"], n_sub=len(d2t))
    model = draft_class(cfg)(cfg, *_target_tables(target), d2t=d2t)
    held_path = out / "heldout.pt"
    if held_path.exists() and model.target_hidden_layers:
        from .features import add_aux

        add_aux(out, model.target_hidden_layers)
    held = load_file(held_path, "the held-out set", "delete it and rerun heldout") if held_path.exists() else []
    curve = []
    for p in saved[curve_every - 1::curve_every]:
        s = int(p.stem.split("_")[1])
        val = next((e.get("val_acc") for e in ckpt["log"] if e["step"] == s), None)
        entry = {"step": s, "val_top1": val}
        if held:
            entry["heldout"] = checkpoint_alpha(out, p, model, held, k)
        curve.append(entry)
        print(json.dumps(curve[-1]), flush=True)
    _load_weights(model, ckpt["model"] if step is None else load_file(chosen, "the checkpoint", "pick another --step"))
    if held and chosen.exists():
        final = checkpoint_alpha(out, chosen, model, held, k)  # cached if the curve already scored it
        _load_weights(model, torch.load(chosen))
    else:
        final = offline_alpha(EagleDrafter(model), held, k) if held else None
    info = {"training": {"steps": ckpt["step"] if step is None else step, "positions": ckpt.get("positions"),
                         "seed": ckpt["seed"], f"heldout_offline_alpha_k{k}": final}}
    if ckpt.get("made"):
        info["training"]["made"] = ckpt["made"]
    if init_meta is not None:  # the draft this run started from (train --init): its own training, one stage earlier
        info["training"]["init"] = {kk: v for kk, v in init_meta.items() if not kk.startswith("heldout")}
    curve_json = json.dumps({"k": k, "curve": curve, "log": [{kk: e[kk] for kk in ("step", "loss", "val_acc", "seconds")
                                                              if kk in e} for e in ckpt["log"]]}, indent=0)
    saved_to = backup_draft(dest, backup)
    _publish(dest, lambda tmp: (save_draft(model, tmp, DEFAULT_DRAFT_NAME, extra=info),
                                (tmp / f"{DEFAULT_DRAFT_NAME}_curve.json").write_text(curve_json)))
    return dict(info, dest=str(dest), backup=saved_to)


def _publish(dest: Path, write) -> None:
    """``write(tmp)`` into a temporary folder next to ``dest``, then each file renamed into ``dest``: an
    interrupted export leaves the shipped draft as it was, never a half-written weights file."""
    import os
    import shutil

    tmp = dest.parent / f".{dest.name}.export-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        write(tmp)
        dest.mkdir(parents=True, exist_ok=True)
        for f in sorted(tmp.iterdir()):
            os.replace(f, dest / f.name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

