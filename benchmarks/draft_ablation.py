"""How the draft's acceptance grows with teacher data and with its architecture, measured offline.

    python benchmarks/draft_ablation.py --baseline LABEL=FOLDER --run LABEL=RUN_DIR [--run ...] [--every N]

Every checkpoint of each training run (``RUN_DIR/ckpts/draft_*.pt``, made by ``python -m specdec_lesson.distill
train --out RUN_DIR``) and the baseline draft (a folder holding ``eagle_smollm2.safetensors/.json``) are replayed
on the same held-out set (``RUN_DIR/heldout.pt``: the target's greedy answers to the benchmark's evaluation
prompts, never trained on) with ``distill.evaluate.offline_alpha``: exactly the greedy chain drafts a speculative
run makes, with no target forward.  Every draft uses the baseline's output subset (its head is the target's frozen
output layer, so the trained weights do not depend on the subset), so the runs differ only in their weights.
Writes ``benchmarks/results/draft_ablation.json`` (read by notebook 08) atomically.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

from specdec_lesson.bench.results import machine_info
from specdec_lesson.distill.evaluate import _load_weights, offline_alpha
from specdec_lesson.distill.features import add_aux
from specdec_lesson.distill.teacher import load_file
from specdec_lesson.drafters.eagle import EagleConfig, EagleDrafter, _target_tables, draft_class, load_draft
from specdec_lesson.models import load_default_target


def _pair(text: str, what: str) -> tuple[str, Path]:
    label, sep, path = text.partition("=")
    if not sep or not label or not Path(path).exists():
        raise SystemExit(f"draft_ablation.py: error: {what} must be LABEL=PATH with an existing PATH, got {text!r}")
    return label, Path(path)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--baseline", required=True, help="LABEL=FOLDER of a shipped-format draft")
    ap.add_argument("--run", action="append", required=True, help="LABEL=RUN_DIR of a distill train run (repeatable)")
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--every", type=int, default=1, help="score every N-th saved checkpoint (the last always)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/draft_ablation.json"))
    a = ap.parse_args()
    base_label, base_dir = _pair(a.baseline, "--baseline")
    runs = [_pair(r, "--run") for r in a.run]
    for _, d in runs:
        if not (d / "ckpt.pt").is_file() or not (d / "heldout.pt").is_file() or not list((d / "ckpts").glob("draft_*.pt")):
            raise SystemExit(f"draft_ablation.py: error: {d} has no ckpt.pt, ckpts/draft_*.pt or heldout.pt: train there first")
    torch.set_num_threads(a.threads)
    target, _ = load_default_target(verbose=False)
    base = load_draft(target, base_dir)
    d2t = base.d2t.clone()
    held = load_file(runs[0][1] / "heldout.pt", "the held-out set", "rerun distill heldout")
    res = {"k": a.k, "machine": machine_info(), "subset": len(d2t),
           "heldout": {"rows": len(held), "kinds": sorted({r["kind"] for r in held}),
                       "positions": sum(len(r["tokens"]) - r["n_prompt"] for r in held)},
           "baseline": {"label": base_label, "meta": json.loads((base_dir / "eagle_smollm2.json").read_text()).get("training"),
                        "heldout": offline_alpha(EagleDrafter(base), held, a.k)}, "runs": []}
    curve_file = base_dir / "eagle_smollm2_curve.json"
    if curve_file.is_file():  # how the baseline itself was trained (its own export's curve: same held-out prompts)
        res["baseline"]["curve"] = json.loads(curve_file.read_text())["curve"]
    print(json.dumps(res["baseline"]["heldout"]), flush=True)
    for label, d in runs:
        ckpt = load_file(d / "ckpt.pt", "the checkpoint", "train again")
        cfg = EagleConfig(ckpt["config"], n_sub=len(d2t))
        model = draft_class(cfg)(cfg, *_target_tables(target), d2t=d2t)
        rows = held
        if model.target_hidden_layers:
            rows = load_file(add_aux(d, model.target_hidden_layers), "the held-out set", "rerun distill heldout")
        saved = sorted((d / "ckpts").glob("draft_*.pt"))
        picked = saved[a.every - 1::a.every] + ([saved[-1]] if (len(saved) % a.every) else [])
        curve = []
        log = {e["step"]: e for e in ckpt["log"]}
        for p in picked:
            step = int(p.stem.split("_")[1])
            _load_weights(model, torch.load(p))
            entry = {"step": step, "seconds": log.get(step, {}).get("seconds"), "val_top1": log.get(step, {}).get("val_acc"),
                     "heldout": offline_alpha(EagleDrafter(model), rows, a.k)}
            curve.append(entry)
            print(label, json.dumps(entry), flush=True)
        res["runs"].append({"label": label, "config": dict(ckpt["config"]), "made": ckpt.get("made"),
                            "positions": ckpt.get("positions"), "steps": ckpt["step"], "curve": curve})
    a.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = a.out.with_name(f".{a.out.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(res, indent=1) + "\n")
    tmp.replace(a.out)
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
