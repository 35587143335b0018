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


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--heldout", type=Path, required=True, help="held-out set of `distill heldout` (heldout.pt)")
    ap.add_argument("--draft", action="append", default=None, help="NAME=FOLDER of a draft (repeatable)")
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--force", action="store_true", help="replace an existing --out")
    a = ap.parse_args(argv)
    if a.k < 1 or a.threads < 1:
        ap.error("--k and --threads must be >= 1")
    drafts = _drafts(a.draft, ap)
    if not a.heldout.is_file():
        ap.error(f"--heldout {a.heldout} does not exist; make it with python -m specdec_lesson.distill heldout "
                 "--out DIR --n-code 12 --n-math 12 --n-requests 12 --n-chat 12")
    if a.out.exists() and not a.force:
        ap.error(f"--out {a.out} exists; pass --force to replace it (or another --out)")
    held = load_file(a.heldout, "the held-out set", "delete it and rerun distill heldout")
    torch.set_num_threads(a.threads)
    from specdec_lesson.models import load_default_target

    target, _ = load_default_target(verbose=False)
    res = {}
    for name, folder in drafts.items():
        model = load_draft(target, folder)
        meta = json.loads((folder / f"{DEFAULT_DRAFT_NAME}.json").read_text())
        acc = offline_alpha(EagleDrafter(model), held, a.k)
        res[name] = {"folder": str(folder), "n_sub": len(model.d2t), "mlp_width": model.cfg["intermediate"],
                     "training": training_summary(meta), "offline": acc,
                     "weights": draft_identity(folder)}  # the sha256 that benchmark records name it by
        print(f"{name:10s} " + "  ".join(f"{s} {acc[s]['alpha_tok']:.3f}" for s in STYLES if s in acc), flush=True)
    counts = {s: sum(r.get("kind") == s for r in held) for s in STYLES}
    result = {
        "what": "offline greedy per-token alpha (and tau at K) of each draft on held-out prompts of four styles",
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": machine_info(), "k": a.k, "heldout": {"file": str(a.heldout), "prompts": counts,
                                                        "reply_tokens": sum(len(r["tokens"]) - r["n_prompt"] for r in held)},
        "drafts": res,
    }
    write_results(result, a.out)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
