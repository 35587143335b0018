"""Distilling the default draft from the target: ``python -m specdec_lesson.distill COMMAND`` (commands below).

corpus   teacher-forced data: real code (HumanEval 0..81 solutions, standard-library functions) as replies
         to the benchmark's code prompt, with the target's hidden states; no generation, so much cheaper.
gen      teacher data: the target's own responses (greedy, and 1 batch in ``--sample-every`` at T=0.7) to
         training prompts (``distill.data``), with its last hidden states; one shard file per batch.
features teacher data recomputed from answer files of token ids (``distill.features``): the target's last
         hidden states and the residual streams an EAGLE-3 draft fuses; no generation.
train    the EAGLE-style draft (``eagle.EagleDraft``, or ``--arch eagle3``: ``eagle3.Eagle3Draft``) on those
         shards, checkpointing atomically.
heldout  the target's greedy answers to the benchmark's EVALUATION prompts, for offline acceptance only.
export   a checkpoint as fp16 safetensors + JSON config under ``specdec_lesson/data/``, with the
         acceptance-per-checkpoint curve (``distill.evaluate``).
export-vllm  the shipped draft as a checkpoint folder vLLM's EAGLE proposer loads (``distill.export_vllm``).
resubset the shipped draft re-headed over another output subset, no retraining (``distill.subset``).
answers  the target's greedy answers to training prompts as token ids in one small ``.npz`` (``distill.answers``):
         the corpus of the lookup over past answers (``drafters.suffix``) and teacher data that survives a new machine.
mix      the target's answers (greedy, 1 in 3 at T=0.7) to a mixture of templated chat, self-written (Magpie), code
         and math prompts, as token ids in shards ``specdec_lesson/data/mixture/mix_<seed>_<nnn>.npz``
         (``distill.mixture``); resumable, deterministic from ``--seed``, finished shards never overwritten.

How each stage of the shipped draft (stage 7) was made: stages 1-2 in ``distill.train``'s docstring, 3-7 in mixture's. Every
file is written to a temporary name and renamed when complete (``atomic_save``), so an interrupted run never leaves a shard or
checkpoint that passes for complete; rerunning the same command resumes: ``gen`` skips finished shards, ``train`` restarts
from the last checkpoint (model, optimizer, step; the data order is a function of the seed and epoch), and gives the same
result as an uninterrupted run when the data did not change meanwhile. ``--fast`` runs the whole pipeline on a tiny random
target in seconds (the tests use it). A checkpoint records the settings that made it (``--fast``, ``--n-sub``, ``--budget``,
``--lr``, ``--unroll``, ``--seed``, ``--intermediate``); a resume with other ones is refused, naming them.

Files the package ships (``specdec_lesson/data``) are never written by default: ``answers`` writes
``runs/distill/answers.npz`` unless ``--file`` says otherwise, and replaces an existing finished file, or writes inside the
package, only with ``--force`` (resuming from its ``.partial.npz`` needs none); ``export`` and ``resubset`` rewrite the
shipped draft only with ``--force``, after copying the files they replace to ``<--out>/export-backup-<time>/`` or
``<--out>/resubset-backup-<time>/`` (or write the draft to ``--dest DIR``, where an existing draft is replaced only with
``--force`` too; ``resubset --src DIR`` re-heads a draft other than the shipped one). ``train`` removes the temporary files of
a killed run.

Bad input (a flag out of range, ``train`` before ``gen``, an unreadable shard or checkpoint, a folder that cannot be written,
a file that would be replaced without ``--force``) prints one ``python -m specdec_lesson.distill: error: ...`` line and exits
with status 2, before the target is loaded where it can be known then; Ctrl-C prints one line (exit 130) and keeps every
finished shard and checkpoint.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

from ..cli_args import OneLineParser, UsageError, check_float, check_int, check_seed, check_threads, check_writable_dir
from .chat_prompts import CHAT_SETS
from .teacher import run_corpus, run_gen, shard_paths
from .train import run_train

__all__ = ["main"]

PROG = "python -m specdec_lesson.distill"


def _parser() -> OneLineParser:
    ap = OneLineParser(prog=PROG, description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("gen", help="teacher data")
    g.add_argument("--out", type=Path, default=Path("runs/distill"))
    g.add_argument("--n-code", type=int, default=1200)
    g.add_argument("--n-math", type=int, default=500)
    g.add_argument("--batch", type=int, default=16)
    g.add_argument("--max-new", type=int, default=192)
    g.add_argument("--sample-every", type=int, default=5)
    g.add_argument("--worker", type=int, default=0)
    g.add_argument("--max-shards", type=int, default=None, help="only the first N shards (batches)")
    g.add_argument("--workers", type=int, default=1)
    c = sub.add_parser("corpus", help="teacher-forced code data (no generation)")
    c.add_argument("--out", type=Path, default=Path("runs/distill"))
    c.add_argument("--n", type=int, default=4000, help="number of (prompt, function) pairs")
    c.add_argument("--shard-size", type=int, default=64)
    c.add_argument("--max-shards", type=int, default=None, help="only the first N shards")
    f = sub.add_parser("features", help="teacher data from answer files of token ids (no generation)")
    f.add_argument("--out", type=Path, default=Path("runs/distill"))
    f.add_argument("--answers", type=Path, action="append", default=None,
                   help="an answers .npz (repeatable; default: every shipped one, drafters.suffix.ANSWER_FILES)")
    f.add_argument("--aux-layers", default=None, help="target layers for the EAGLE-3 input, e.g. 2,15,27 (default: "
                   "EAGLE-3's 2, L/2, L-3), or none")
    f.add_argument("--shard-rows", type=int, default=128)
    f.add_argument("--budget", type=int, default=8192, help="padded positions per forward")
    f.add_argument("--max-shards", type=int, default=None, help="only the first N shards")
    f.add_argument("--mixture", action="store_true", help="also every mixture shard (distill.mixture.mixture_files())")
    f.add_argument("--bf16", action="store_true", help="bfloat16 autocast for the target's forward (about 2x faster "
                   "on AVX512-BF16 or AMX; features within about 1%% of fp32)")
    t = sub.add_parser("train", help="train the draft")
    t.add_argument("--out", type=Path, default=Path("runs/distill"))
    t.add_argument("--steps", type=int, default=1500)
    t.add_argument("--budget", type=int, default=3072, help="padded positions per batch")
    t.add_argument("--lr", type=float, default=6e-4)
    t.add_argument("--n-sub", type=int, default=6144, help="size of the draft's output vocabulary subset")
    t.add_argument("--unroll", type=int, default=2, help="training-time-test steps")
    t.add_argument("--ckpt-every", type=int, default=50)
    t.add_argument("--val-every", type=int, default=50)
    t.add_argument("--reload", action="store_true", help="pick up new shards at each epoch")
    t.add_argument("--arch", choices=("eagle", "eagle3"), default="eagle")
    t.add_argument("--aux-layers", default=None, help="with --arch eagle3: the fused target layers (default 2, L/2, L-3)")
    t.add_argument("--decay", type=float, default=0.8, help="weight decay**s of unrolled step s's loss")
    t.add_argument("--init", type=Path, default=None, help="start from this draft folder or draft_*.pt (same arch)")
    t.add_argument("--bf16", action="store_true", help="bfloat16 autocast (fp32 weights): about 2.5x faster on AVX512-BF16")
    t.add_argument("--intermediate", type=int, default=None, help="the draft's MLP width (default: the target's; --init widened)")
    h = sub.add_parser("heldout", help="target greedy outputs on evaluation prompts (offline alpha only)")
    h.add_argument("--out", type=Path, default=Path("runs/distill"))
    h.add_argument("--n-code", type=int, default=12)
    h.add_argument("--n-math", type=int, default=12)
    h.add_argument("--n-requests", type=int, default=0, help="also the first N held-out function requests")
    h.add_argument("--n-chat", type=int, default=0, help="also the first N held-out chat prompts")
    h.add_argument("--max-new", type=int, default=128)
    x = sub.add_parser("export", help="write the last checkpoint as a draft (the shipped one with --force)")
    x.add_argument("--out", type=Path, default=Path("runs/distill"))
    x.add_argument("--dest", type=Path, default=None, help="folder for the draft (default: the shipped draft's own "
                   "folder, rewritten only with --force)")
    x.add_argument("--force", action="store_true", help="replace the shipped draft (or a draft in --dest); the replaced "
                   "files are copied to <--out>/export-backup-<time>/ first")
    x.add_argument("--k", type=int, default=4)
    x.add_argument("--step", type=int, default=None, help="checkpoint to ship (default: the last)")
    x.add_argument("--curve-every", type=int, default=1)
    x.add_argument("--n-sub", type=int, default=None, help="re-choose the output subset with this many tokens")
    x.add_argument("--init-json", type=Path, default=None,
                   help="the JSON of the draft train --init started from: its training is recorded as the earlier stage")
    w = sub.add_parser("answers", help="the target's greedy answers to training prompts, as token ids (one .npz)")
    w.add_argument("--file", type=Path, default=None, help="output .npz (default: runs/distill/answers.npz; an existing "
                   "file, or one inside the package's shipped data, needs --force)")
    w.add_argument("--force", action="store_true", help="replace an existing --file, or write inside specdec_lesson/data")
    w.add_argument("--n-code", type=int, default=400)
    w.add_argument("--n-math", type=int, default=400)
    w.add_argument("--batch", type=int, default=16)
    w.add_argument("--max-new", type=int, default=160)
    w.add_argument("--max-batches", type=int, default=None, help="stop after N batches (a prefix of the prompts)")
    w.set_defaults(out=Path("runs/distill"))
    m = sub.add_parser("mix", help="the target's answers to a mixture of chat, Magpie, code and math prompts, as token "
                       "ids in shards (distill.mixture)")
    m.add_argument("--out", type=Path, default=None, help="shard folder (default: specdec_lesson/data/mixture)")
    m.add_argument("--shards", type=int, required=True, help="make shards 0..N-1 of --seed (finished ones are kept)")
    m.add_argument("--shard-size", type=int, default=256, help="answers per shard")
    m.add_argument("--batch", type=int, default=32)
    m.add_argument("--max-new", type=int, default=192)
    m.add_argument("--shares", default=None, help="the kinds' proportions, e.g. chat=0.25,magpie=0.45,code=0.18,math=0.12 "
                   "(default: distill.mixture.SHARES); recorded in each shard, so a resume must give the same")
    m.add_argument("--chat-set", type=int, default=1, choices=sorted(CHAT_SETS), help="the templated chat prompts: "
                   "set 1 (distill.chat_prompts; seeds 0, 1 used it up) or 2 (chat_prompts2); recorded from 2 on")
    r = sub.add_parser("resubset", help="re-head the shipped draft over the N most frequent reply tokens of the answers")
    r.add_argument("--n-sub", type=int, required=True, help="size of the new output subset")
    r.add_argument("--heldout", type=Path, default=None, help="held-out set (distill heldout) to rescore alpha on")
    r.add_argument("--k", type=int, default=4)
    r.add_argument("--src", type=Path, default=None, help="folder of the draft to re-head (default: the shipped draft)")
    r.add_argument("--dest", type=Path, default=None, help="folder for the re-headed draft (default: the shipped draft's "
                   "own folder, rewritten only with --force)")
    r.add_argument("--force", action="store_true", help="rewrite the shipped draft (or a draft in --dest); the replaced "
                   "files are copied to <--out>/resubset-backup-<time>/ first")
    r.add_argument("--out", type=Path, default=Path("runs/distill"), help="the backup of replaced files goes under it "
                   "(default runs/distill)")
    v = sub.add_parser("export-vllm", help="the shipped draft as a checkpoint folder vLLM's EAGLE proposer loads")
    v.add_argument("--dest", type=Path, default=None, help="checkpoint folder (default: the cache folder the bench uses)")
    v.add_argument("--out", type=Path, default=Path("runs/distill"), help=argparse.SUPPRESS)
    r.set_defaults(out=Path("runs/distill"))
    for p in (g, c, f, t, h, x, v, w, r, m):
        p.add_argument("--seed", type=int, default=0)
        p.add_argument("--fast", action="store_true")
        p.add_argument("--threads", type=int, default=1)
    return ap


def _check(a) -> None:
    """Every flag of the command, and the folders it needs, before any model is loaded (UsageError)."""
    check_seed(a.seed, "--seed")
    check_threads(a.threads, "--threads", allow_none=False)
    pos = lambda name, allow_none=False: check_int(getattr(a, name), "--" + name.replace("_", "-"), lo=1, allow_none=allow_none)
    if a.cmd == "answers":
        pos("batch")
        pos("max_batches", True)
        if a.file is not None and a.file.suffix != ".npz":
            raise UsageError(f"--file must end in .npz, got {a.file}")
        if a.file is not None:
            check_writable_dir(a.file.parent, "--file's folder")
    if a.cmd in ("gen", "heldout", "answers"):
        for name in ("n_code", "n_math"):
            check_int(getattr(a, name), "--" + name.replace("_", "-"), lo=0)
        if a.cmd == "heldout":
            for name in ("n_requests", "n_chat"):
                check_int(getattr(a, name), "--" + name.replace("_", "-"), lo=0)
        if a.n_code + a.n_math + getattr(a, "n_requests", 0) + getattr(a, "n_chat", 0) < 1:
            flags = "--n-code + --n-math" + (" + --n-requests + --n-chat" if a.cmd == "heldout" else "")
            raise UsageError(f"{flags} must be >= 1: there would be no prompt to answer")
        pos("max_new")
    if a.cmd == "gen":
        pos("batch")
        pos("max_shards", True)
        pos("workers")
        check_int(a.sample_every, "--sample-every", lo=0)
        check_int(a.worker, "--worker", lo=0, hi=a.workers - 1)
    elif a.cmd == "features":
        pos("shard_rows")
        pos("budget")
        pos("max_shards", True)
        for p in a.answers or []:
            if not p.is_file():
                raise UsageError(f"--answers {p} does not exist; make it with {PROG} answers --file {p}")
    elif a.cmd == "corpus":
        pos("n")
        pos("shard_size")
        pos("max_shards", True)
    elif a.cmd == "train":
        for name in ("steps", "budget", "n_sub", "unroll", "ckpt_every", "val_every", "intermediate"):
            pos(name, name == "intermediate")
        check_float(a.lr, "--lr", lo=0.0, lo_open=True)
        check_float(a.decay, "--decay", lo=0.0, hi=1.0, lo_open=True)
        if a.init is not None and not a.init.exists():
            raise UsageError(f"--init {a.init} does not exist: pass a draft folder (e.g. specdec_lesson/data) or a draft_*.pt")
        if a.aux_layers is not None and a.arch != "eagle3":
            raise UsageError("--aux-layers applies to --arch eagle3 only")
        if a.intermediate is not None and a.arch != "eagle":
            raise UsageError("--intermediate applies to --arch eagle only")
        if not shard_paths(a.out):
            raise UsageError(f"no teacher data under {a.out / 'data'} (no shard_*.pt): run gen (or corpus) with "
                             f"--out {a.out} first")
    elif a.cmd == "export":
        pos("k")
        pos("step", True)
        pos("curve_every")
        pos("n_sub", True)
        if a.init_json is not None:
            a.init_meta = _init_meta(a.init_json)
        if not (a.out / "ckpt.pt").is_file():
            raise UsageError(f"no checkpoint {a.out / 'ckpt.pt'}: run train with --out {a.out} first")
        from ..drafters.eagle import DEFAULT_DRAFT_DIR
        from .evaluate import check_draft_dest

        if a.dest is not None:
            check_writable_dir(a.dest, "--dest")
        check_draft_dest(a.dest or DEFAULT_DRAFT_DIR, a.force, "export")
    elif a.cmd == "resubset":
        pos("n_sub")
        pos("k")
        if a.heldout is not None and not a.heldout.is_file():
            raise UsageError(f"--heldout {a.heldout} does not exist; make it with {PROG} heldout --out DIR")
    elif a.cmd == "export-vllm" and a.dest is not None:
        check_writable_dir(a.dest, "--dest")
    elif a.cmd == "mix":
        from .mixture import DEFAULT_DIR, check_shares

        for name in ("shards", "shard_size", "batch", "max_new"):
            pos(name)
        a.out = a.out or DEFAULT_DIR
        if a.shares is not None:
            raw, pairs = a.shares, [kv.split("=") for kv in a.shares.split(",")]
            try:
                if any(len(kv) != 2 for kv in pairs):
                    raise ValueError("each item must be one kind=share pair")
                a.shares = check_shares({k.strip(): float(v) for k, v in pairs})
            except ValueError as e:  # a malformed pair, a bad number or a bad set of kinds
                raise UsageError(f"--shares {raw!r}: {e}; write kind=share pairs separated by commas, e.g. "
                                 f"chat=0.25,magpie=0.45,code=0.18,math=0.12") from None
    if a.cmd in ("features", "train"):
        a.aux_layers = _layers(a.aux_layers)
        if a.cmd == "train" and a.aux_layers == "none":
            raise UsageError("--aux-layers none: an eagle3 draft needs fused layers; give layer indices or leave it out")
    if a.cmd in ("heldout", "export", "export-vllm", "answers", "resubset") and a.fast:
        raise UsageError(f"{a.cmd} always runs on the real target; --fast does not apply (and a --fast checkpoint "
                         "cannot be exported)")
    check_writable_dir(a.out, "--out")
    if a.cmd == "answers":
        from .answers import check_answers_out

        a.file = check_answers_out(a.file or a.out / "answers.npz", a.force)
    elif a.cmd == "resubset":
        from ..drafters.eagle import DEFAULT_DRAFT_DIR
        from .subset import check_resubset_dest

        if a.dest is not None:
            check_writable_dir(a.dest, "--dest")
        check_resubset_dest(a.src or DEFAULT_DRAFT_DIR, a.dest or DEFAULT_DRAFT_DIR, a.force)


def _init_meta(path: Path) -> dict | None:
    """The ``training`` record of ``export --init-json``: the JSON object beside a draft's .safetensors."""
    if not path.is_file():
        raise UsageError(f"--init-json {path} does not exist (the draft's .json beside its .safetensors)")
    try:
        meta = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UsageError(f"--init-json {path} is not readable JSON ({exc}); pass the draft's .json beside its "
                         ".safetensors") from None
    if not isinstance(meta, dict) or not isinstance(meta.get("training", {}), dict):
        raise UsageError(f"--init-json {path} holds a JSON {type(meta).__name__}, not a draft record (an object with "
                         "a 'training' object); pass the draft's .json beside its .safetensors")
    return meta.get("training")


def _layers(text: str | None) -> tuple[int, ...] | None | str:
    """``--aux-layers``: None (the default layers), "none" (no aux features) or a tuple of layer indices >= 1."""
    if text is None or text.strip().lower() == "none":
        return None if text is None else "none"
    try:
        layers = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise UsageError(f"--aux-layers must be comma-separated layer indices such as 2,15,27, got {text!r}") from None
    if not layers or min(layers) < 1:
        raise UsageError(f"--aux-layers must be layer indices >= 1, got {text!r}")
    return layers


def main(argv: list[str] | None = None) -> int:
    """The command line; returns the exit status (0, 2 for bad input, 130 for Ctrl-C)."""
    try:
        a = _parser().parse_args(argv)
        _check(a)
        torch.set_num_threads(a.threads)
        _run(a)
    except (ValueError, RuntimeError, OSError) as exc:
        print(f"{PROG}: error: {' '.join(str(exc).split()) or type(exc).__name__}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted; every finished shard and checkpoint is kept: rerun the same command to resume",
              file=sys.stderr)
        return 130
    return 0


def _run(a) -> None:
    t0 = time.time()
    if a.cmd in ("gen", "corpus"):
        n = (run_gen(a.out, a.n_code, a.n_math, a.batch, a.max_new, a.seed, a.worker, a.workers, a.sample_every, a.fast,
                     max_shards=a.max_shards) if a.cmd == "gen"
             else run_corpus(a.out, a.n, a.seed, a.shard_size, fast=a.fast, max_shards=a.max_shards))
        print(json.dumps({"shards_written": n, "seconds": round(time.time() - t0, 1)}))
    elif a.cmd == "features":
        from ..drafters.eagle3 import default_aux_layers
        from ..drafters.suffix import ANSWER_FILES
        from .features import run_features

        files = a.answers or [p for p in ANSWER_FILES if p.is_file()]
        if a.mixture:
            from .mixture import mixture_files

            files = files + mixture_files()
        layers = None if a.aux_layers == "none" else a.aux_layers
        if layers is None and a.aux_layers != "none":
            from .teacher import _teacher

            layers = default_aux_layers(_teacher(a.fast, 0)[0].config.num_hidden_layers)
        n = run_features(a.out, files, layers, a.shard_rows, a.budget, fast=a.fast, max_shards=a.max_shards,
                         bf16=a.bf16)
        print(json.dumps({"shards_written": n, "aux_layers": layers, "seconds": round(time.time() - t0, 1)}))
    elif a.cmd == "heldout":
        from .evaluate import run_heldout

        print(run_heldout(a.out, a.n_code, a.n_math, a.max_new, n_requests=a.n_requests, n_chat=a.n_chat))
    elif a.cmd == "export":
        from .evaluate import run_export

        init_meta = a.init_meta if a.init_json else None  # read and checked by _check
        backup = a.out / f"export-backup-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}"
        print(json.dumps(run_export(a.out, a.dest, k=a.k, step=a.step, curve_every=a.curve_every, n_sub=a.n_sub,
                                    init_meta=init_meta, force=a.force, backup=backup)))
    elif a.cmd == "resubset":
        from ..drafters.eagle import DEFAULT_DRAFT_DIR
        from .subset import run_resubset

        dest = a.dest or DEFAULT_DRAFT_DIR
        backup = a.out / f"resubset-backup-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}"
        info = run_resubset(a.n_sub, a.heldout, a.k, dest, src=a.src or DEFAULT_DRAFT_DIR, force=a.force, backup=backup)
        print(json.dumps({"subset": info["subset"], "dest": str(dest), "backup": info["backup"],
                          "heldout": info.get("training", {}).get(f"heldout_offline_alpha_k{a.k}")}))
    elif a.cmd == "answers":
        from .answers import run_answers

        meta = run_answers(a.file, a.n_code, a.n_math, a.batch, a.max_new, a.seed, max_batches=a.max_batches,
                           force=a.force)  # a.file: set and checked by _check
        print(json.dumps(dict(meta, seconds=round(time.time() - t0, 1))))
    elif a.cmd == "mix":
        from .mixture import run_mix

        print(json.dumps(run_mix(a.out, a.seed, a.shards, a.shard_size, a.batch, a.max_new, fast=a.fast,
                                 shares=a.shares, chat_set=a.chat_set)))
    elif a.cmd == "export-vllm":
        from ..models import load_default_target
        from .export_vllm import ARCH, default_export_dir, export_vllm

        target, _ = load_default_target(verbose=False)
        path = export_vllm(target, a.dest or default_export_dir())
        print(f"vLLM EAGLE checkpoint written to {path} (architecture {ARCH}; bench/vllm_worker.py registers it in vLLM)")
    elif a.cmd == "train":
        res = run_train(a.out, a.steps, a.budget, a.lr, a.n_sub, a.unroll, a.seed, a.fast, a.ckpt_every, a.val_every,
                        reload=a.reload, arch=a.arch, decay=a.decay, init=a.init, aux_layers=a.aux_layers, bf16=a.bf16,
                        intermediate=a.intermediate)
        print(json.dumps({"step": res["step"], "last": res["log"][-1], "seconds": round(time.time() - t0, 1)}))


if __name__ == "__main__":
    sys.exit(main())
