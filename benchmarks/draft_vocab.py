"""The draft's vocabulary subset, chosen by measured acceptance per millisecond (lever 1 of the speed work).

The shipped draft predicts the target's next feature and scores it with the target's own (frozen) output layer
restricted to N tokens (``d2t``).  Its trained weights do not depend on N, so one draft can be measured at every N.
A small N makes the head cheap but leaves out tokens the target emits: the draft can never propose them.  For N in
``--sizes``, using the N most frequent reply tokens of the target's own shipped answers
(``distill.subset.answer_subset``: training prompts only), plus the shipped subset itself, this measures:

* greedy per-token acceptance alpha and tau, replayed offline (``distill.evaluate.offline_alpha``) on the held-out
  set.  This is the target's greedy answers to the benchmark's evaluation prompts (``distill heldout``); the
  replay gives exactly the drafts a greedy run makes, with no target forward;
* the draft's milliseconds per drafted token: K drafts proposed on a 200-token context, all N interleaved, median
  of ``--rounds``;
* the target's one-token and (K+1)-token forwards in their fastest form (``load_default_pair``'s dispatch), hence
  c = draft ms per token / T(1) and the verify ratio T(K+1) / T(1);
* the closed-form speedup ``theory.speedup(alpha, K, c, verify_ratio)``: acceptance per millisecond, in one number.

It writes ``benchmarks/results/draft_vocab.json``.

    python benchmarks/draft_vocab.py --heldout runs/distill/heldout.pt   # about 4 minutes on a 2-core CPU
    python -m specdec_lesson.distill heldout --out runs/distill --n-code 10 --n-math 10   # makes the held-out set
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import time
from pathlib import Path

import torch

from specdec_lesson import theory
from specdec_lesson.bench.results import machine_info, write_results
from specdec_lesson.distill.evaluate import offline_alpha
from specdec_lesson.distill.subset import SUBSET_SOURCE, answer_subset, with_subset
from specdec_lesson.distill.teacher import load_file, load_shards, shard_paths
from specdec_lesson.drafters.eagle import EagleDrafter
from specdec_lesson.profiling import measure_verify_curve
from specdec_lesson.sampling import SamplingConfig

RESULTS = Path(__file__).resolve().parent / "results" / "draft_vocab.json"


def draft_ms(models: dict, k: int, rounds: int, gen: torch.Generator) -> dict[str, float]:
    """Median ms per drafted token of each draft, proposing ``k`` greedily on the same 200-token context."""
    ctx = torch.randint(100, 40000, (1, 200), generator=gen)  # [1, 200]
    feats = torch.randn(1, 199, next(iter(models.values())).cfg["hidden"], generator=gen)  # [1, 199, H]
    greedy, times = SamplingConfig(0.0), {n: [] for n in models}
    drafters = {}
    with torch.inference_mode():
        for name, m in models.items():
            d = EagleDrafter(m, add_prompt_tokens=False)
            d.begin(ctx, torch.ones_like(ctx, dtype=torch.bool), feats)
            d.propose(k, greedy, None)  # warm-up
            drafters[name] = d
        for _ in range(rounds):  # interleaved over the subsets
            for name, d in drafters.items():
                t0 = time.perf_counter()
                d.propose(k, greedy, None)
                times[name].append((time.perf_counter() - t0) * 1e3 / k)
    return {n: statistics.median(t) for n, t in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--heldout", type=Path, help="held-out set made by `distill heldout` (heldout.pt)")
    src.add_argument("--mixture", type=Path, help="a teacher folder of `distill features` (e.g. runs/mix1): its "
                     "validation rows (every 25th, as `distill train` holds out) score the subsets, no benchmark prompt")
    ap.add_argument("--max-rows", type=int, default=None, help="score on at most this many rows, spread evenly")
    ap.add_argument("--draft", type=Path, default=None, help="draft folder to score (default: the shipped draft)")
    ap.add_argument("--sizes", default="1024,2048,4096,8192,16384,32768,49152", help="subset sizes N, comma-separated")
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=30, help="timed rounds of the draft (median)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=RESULTS)
    a = ap.parse_args()
    try:
        sizes = [int(s) for s in a.sizes.split(",") if s.strip()]
    except ValueError:
        ap.error(f"--sizes must be comma-separated integers, got {a.sizes!r}")
    if not sizes or min(sizes) < 1:
        ap.error(f"--sizes must be integers >= 1, got {a.sizes!r}")
    if a.max_rows is not None and a.max_rows < 1:
        ap.error(f"--max-rows must be >= 1, got {a.max_rows}")
    if min(a.k, a.rounds, a.threads) < 1:
        ap.error("--k, --rounds and --threads must be >= 1")
    if a.heldout is not None and not a.heldout.is_file():
        ap.error(f"--heldout {a.heldout} does not exist; make it with "
                 "python -m specdec_lesson.distill heldout --out DIR --n-code 10 --n-math 10")
    if a.mixture is not None and not shard_paths(a.mixture):
        ap.error(f"--mixture {a.mixture} holds no teacher shards (data/shard_*.pt); make them with "
                 "python -m specdec_lesson.distill features --out DIR --mixture")
    if a.draft is not None and not (a.draft / "eagle_smollm2.json").is_file():
        ap.error(f"--draft {a.draft} holds no draft (eagle_smollm2.json + .safetensors); pass a folder export wrote")
    if a.heldout is not None:
        held = load_file(a.heldout, "the held-out set", "delete it and rerun distill heldout")
    else:
        held = [r for i, r in enumerate(load_shards(a.mixture)) if i % 25 == 24]  # distill train's validation split
    if a.max_rows is not None:
        held = held[:: max(1, len(held) // a.max_rows)][: a.max_rows]
    torch.set_num_threads(a.threads)
    load0 = os.getloadavg()
    from specdec_lesson.drafters.pair import load_default_pair

    pair = load_default_pair()
    target, shipped = pair.target, pair.draft.model
    if a.draft is not None:
        from specdec_lesson.drafters.eagle import load_draft

        shipped = load_draft(target, a.draft)
    V = target.config.vocab_size
    sizes = sorted({min(n, V) for n in sizes})
    eos = pair.tokenizer.eos_token_id
    models = {f"answers-{n}": with_subset(shipped, target, answer_subset(n, V, eos)) for n in sizes}
    models[f"shipped-{len(shipped.d2t)}"] = shipped
    replies = torch.cat([r["tokens"][r["n_prompt"]:] for r in held])  # the held-out replies' tokens
    out: dict[str, dict] = {}
    for name, m in models.items():
        inside = torch.isin(replies, m.d2t).double().mean().item()
        acc = offline_alpha(EagleDrafter(m), held, a.k)
        out[name] = {"n": len(m.d2t), "coverage_of_heldout_replies": inside, "offline": acc}
        print(f"{name:14s} coverage {inside:.4f}  alpha " + " ".join(f"{kind} {v['alpha_tok']:.3f}" for kind, v in
                                                                    sorted(acc.items())), flush=True)
    gen = torch.Generator().manual_seed(0)
    ms = draft_ms(models, a.k, a.rounds, gen)
    curve = measure_verify_curve(target, context=200, repeats=a.rounds // 3 or 1, ns=(1, a.k + 1))
    t1, verify_ratio = curve[1] * 1e3, curve[a.k + 1] / curve[1]
    for name, r in out.items():
        r["draft_ms_per_token"] = ms[name]
        r["c"] = ms[name] / t1
        r["predicted_speedup"] = {kind: theory.speedup(v["alpha_tok"], a.k, r["c"], verify_ratio)
                                  for kind, v in r["offline"].items()}
        print(f"{name:14s} {ms[name]:5.2f} ms/token  c {r['c']:.3f}  S " + " ".join(
            f"{kind} {v:.3f}" for kind, v in sorted(r["predicted_speedup"].items())), flush=True)
    kinds = sorted(next(iter(out.values()))["predicted_speedup"])
    best = {kind: max(out, key=lambda n: out[n]["predicted_speedup"][kind]) for kind in kinds}
    result = {
        "what": "the shipped draft's head over N-token vocabulary subsets: held-out offline alpha, draft ms per token, "
                "c, and theory.speedup(alpha, K, c, T(K+1)/T(1)) measured in the same run",
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": {**machine_info(), "loadavg_before": load0, "loadavg_after": os.getloadavg()},
        "dispatch": getattr(target, "dispatch_profile", None), "k": a.k, "rounds": a.rounds,
        "scored_on": {"source": str(a.heldout) if a.heldout is not None else f"{a.mixture} (validation split, every "
                      "25th row: training prompts' answers the draft was not trained on)",
                      "rows": len(held), "reply_tokens": len(replies)},
        "draft": str(a.draft) if a.draft is not None else "shipped",
        "subset_source": SUBSET_SOURCE,
        "target_ms": {"T1": t1, f"T{a.k + 1}": curve[a.k + 1] * 1e3}, "verify_ratio": verify_ratio,
        "subsets": out, "best": best,
    }
    write_results(result, a.out)
    print("best: " + ", ".join(f"{k} {v}" for k, v in best.items()) + f"; wrote {a.out}")


if __name__ == "__main__":
    main()
