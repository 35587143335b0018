"""The draft's acceptance per prompt style, before and after a retraining (issue 24: a draft that knows chat).

For each draft folder given (``--draft NAME=FOLDER``, the shipped draft as ``shipped`` by default) this replays the
draft offline (``distill.evaluate.offline_alpha``: exactly the drafts a greedy speculative run makes, no target
forward) on the target's greedy answers to held-out prompts of four styles: HumanEval-like code (HumanEval 82..),
math word problems, free-form function requests and general chat (``distill heldout --n-requests --n-chat``; none
of them is a training prompt: tests/test_mixture.py checks, near-duplicates included).  It reports per style the
per-token alpha (Leviathan's: accepted / (accepted + rejections)), the share of proposed drafts accepted, and tau
(tokens per target forward) at K, and writes ``benchmarks/results/draft_styles.json`` (``--force`` replaces it).

    python -m specdec_lesson.distill heldout --out runs/held4 --n-code 12 --n-math 12 --n-requests 12 --n-chat 12 \\
        --max-new 128 --threads 2
    python benchmarks/draft_styles.py --heldout runs/held4/heldout.pt --draft before=runs/stage2 --draft after=specdec_lesson/data

``--train-data DIR`` (a training run's ``--out``, whose ``data/`` holds its teacher shards) adds, per kind of training
prompt, rows the run trained on (``train/<kind>``) and rows of its validation split (``val/<kind>``: the trainer's rows
i % 25 == 24, never trained on, from the same prompt distribution), greedy answers only, cut to the held-out set's
128 answer tokens: how much of the gap to the held-out prompts is memory, and how much is a shift of distribution.
The shards' features are the run's (bf16 when made with ``--bf16``), the held-out set's fp32.

Alpha here is offline and greedy; the benchmark's alpha (bench) comes from real runs and agrees with it up to float
noise in the features.
"""

from __future__ import annotations

import argparse
import datetime
import json
from pathlib import Path

import torch

from specdec_lesson.bench.results import machine_info, write_results
from specdec_lesson.distill.evaluate import offline_alpha
from specdec_lesson.distill.teacher import load_file
from specdec_lesson.drafters.eagle import DEFAULT_DRAFT_DIR, DEFAULT_DRAFT_NAME, EagleDrafter, draft_identity, load_draft

RESULTS = Path(__file__).resolve().parent / "results" / "draft_styles.json"
STYLES = ("code", "requests", "math", "chat")


def _drafts(specs: list[str], ap: argparse.ArgumentParser) -> dict[str, Path]:
    out = {}
    for spec in specs or [f"shipped={DEFAULT_DRAFT_DIR}"]:
        name, sep, folder = spec.partition("=")
        if not sep or not name or not folder:
            ap.error(f"--draft must be NAME=FOLDER (e.g. before=runs/stage2), got {spec!r}")
        if not (Path(folder) / f"{DEFAULT_DRAFT_NAME}.json").is_file():
            ap.error(f"--draft {spec}: {folder} holds no {DEFAULT_DRAFT_NAME}.json; pass a folder distill export wrote")
        if name in out:
            ap.error(f"--draft name {name!r} given twice")
        out[name] = Path(folder)
    return out


def training_summary(meta: dict) -> dict:
    """Steps and runs along the draft's chain of ``--init`` runs (each export nests the run it started from)."""
    chain, node = [], meta.get("training")
    while isinstance(node, dict) and node:
        chain.append(node)
        node = node.get("init")
    return {"runs": len(chain), "steps_total": sum(int(n.get("steps", 0)) for n in chain),
            "last_run": {"steps": chain[0].get("steps"), "positions": chain[0].get("positions"),
                         "lr": (chain[0].get("made") or {}).get("lr"), "seed": (chain[0].get("made") or {}).get("seed")}
            if chain else None}


def training_rows(folder: Path, per_group: int = 24, max_new: int = 128, min_new: int = 48) -> list[dict]:
    """``per_group`` greedy rows per (kind, split) of the teacher data under ``folder``, spread evenly over the shards,
    each cut to ``max_new`` answer tokens (rows with fewer than ``min_new`` are left out), kind ``"<split>/<kind>"``."""
    from specdec_lesson.distill.teacher import load_shards

    rows, groups = load_shards(folder), {}
    for i, r in enumerate(rows):  # the trainer's split (distill.train.run_train): row i validates when i % 25 == 24
        if float(r.get("temperature", 0.0)) == 0.0 and len(r["tokens"]) - r["n_prompt"] >= min_new:
            groups.setdefault(f"{'val' if i % 25 == 24 else 'train'}/{r.get('kind', 'gen')}", []).append(i)
    out = []
    for kind, idx in sorted(groups.items()):
        for i in idx[:: max(1, len(idx) // per_group)][:per_group]:
            r, n = rows[i], rows[i]["n_prompt"]
            out.append({"tokens": r["tokens"][: n + max_new], "feats": r["feats"][: n + max_new - 1].float(),
                        "n_prompt": n, "kind": kind})
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--heldout", type=Path, required=True, help="held-out set of `distill heldout` (heldout.pt)")
    ap.add_argument("--draft", action="append", default=None, help="NAME=FOLDER of a draft (repeatable)")
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--force", action="store_true", help="replace an existing --out")
    ap.add_argument("--train-data", type=Path, default=None, help="a training run's --out: also its trained-on and "
                    "validation rows per kind of prompt")
    a = ap.parse_args(argv)
    if a.k < 1 or a.threads < 1:
        ap.error("--k and --threads must be >= 1")
    drafts = _drafts(a.draft, ap)
    if not a.heldout.is_file():
        ap.error(f"--heldout {a.heldout} does not exist; make it with python -m specdec_lesson.distill heldout "
                 "--out DIR --n-code 12 --n-math 12 --n-requests 12 --n-chat 12")
    if a.out.exists() and not a.force:
        ap.error(f"--out {a.out} exists; pass --force to replace it (or another --out)")
    if a.train_data is not None and not list((a.train_data / "data").glob("shard_*.pt")):
        ap.error(f"--train-data {a.train_data} holds no data/shard_*.pt; pass the --out of a distill features or gen run")
    held = load_file(a.heldout, "the held-out set", "delete it and rerun distill heldout")
    extra = training_rows(a.train_data) if a.train_data is not None else []
    torch.set_num_threads(a.threads)
    from specdec_lesson.models import load_default_target

    target, _ = load_default_target(verbose=False)
    res = {}
    for name, folder in drafts.items():
        model = load_draft(target, folder)
        meta = json.loads((folder / f"{DEFAULT_DRAFT_NAME}.json").read_text())
        acc = offline_alpha(EagleDrafter(model), held, a.k)  # "all": the held-out prompts alone
        if extra:
            acc.update({s: v for s, v in offline_alpha(EagleDrafter(model), extra, a.k).items() if s != "all"})
        res[name] = {"folder": str(folder), "n_sub": len(model.d2t), "mlp_width": model.cfg["intermediate"],
                     "training": training_summary(meta), "offline": acc,
                     "weights": draft_identity(folder)}  # the sha256 that benchmark records name it by
        print(f"{name:10s} " + "  ".join(f"{s} {acc[s]['alpha_tok']:.3f}" for s in STYLES if s in acc), flush=True)
        if extra:
            print(" " * 11 + "  ".join(f"{s} {v['alpha_tok']:.3f}" for s, v in acc.items() if "/" in s), flush=True)
    counts = {s: sum(r.get("kind") == s for r in held) for s in STYLES}
    result = {
        "what": "offline greedy per-token alpha (and tau at K) of each draft on held-out prompts of four styles",
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": machine_info(), "k": a.k, "heldout": {"file": str(a.heldout), "prompts": counts,
                                                        "reply_tokens": sum(len(r["tokens"]) - r["n_prompt"] for r in held)},
        "drafts": res,
    }
    if extra:
        result["train_data"] = {"folder": str(a.train_data), "answer_tokens_max": 128,
                                "rows": {k: sum(r["kind"] == k for r in extra) for k in sorted({r["kind"] for r in extra})}}
    write_results(result, a.out)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
