"""The cost model calibrated on the benchmark runs' own counters, checked on held-out prompts (issue 27, part 2).

    python benchmarks/calibrate_inrun.py [--force] [--out PATH]

Pure arithmetic on committed files, no model and no timing (a second or two):

1. Per results file (AMD EPYC: bench_default_t0 + ksweep_default_t0; Intel Xeon: bench_default_t0_intel +
   archive/bench_autok_t0_intel): the in-run costs of ``specdec_lesson.sim.runcost`` (plain decode step, T(n) with its
   monotone fit, the draft's seconds per step and its a + b (K - 1) fit, overhead, prefill).
2. Held out: leave one prompt out.  For each (task, prompt) of a file, the costs are calibrated on the file's other
   prompts and the prompt's speedup is predicted from its own acceptance counters (tau; and the i.i.d. closed form
   from its alpha, chain only), then compared with its measured paired speedup (``bench.paired.prompt_speedup``:
   median over repeats of the repeat's throughput over ``ar``'s).  Chain labels, and hybrid labels (verify cost from
   their ``verify_hist``, draft cost per draft forward; see ``runcost``).  The old probe profile
   (``calibration.json``, measured on an AMD EPYC) predicts the same chain prompts from the same tau, for comparison.
3. Per machine kind (the runs of its files that timed the same forward as its first file pooled: the lean forward's
   step costs are not Hugging Face's): the alpha that 2.5x needs (decode only, as notebook 06 asked it),
   and ``draft_vocab.json``'s predicted speedups redone with the AMD in-run costs, the draft's in-run cost scaled by
   each subset's measured ms per token over the shipped subset's; the same for ``draft_vocab_mixture_intel.json`` (the
   subsets scored on the mixture's validation split, chat included) with the Intel in-run costs.

Writes ``benchmarks/results/calibration_inrun.json``; refuses to replace it without ``--force``.
"""

from __future__ import annotations

import datetime
import json
import sys
from pathlib import Path

from specdec_lesson import theory
from specdec_lesson.bench.paired import paired_cells, prompt_speedup
from specdec_lesson.bench.results import write_results
from specdec_lesson.cli_args import OneLineParser, UsageError, check_output_file
from specdec_lesson.sim.calibrate import Profile, predict_speedup
from specdec_lesson.sim.runcost import alpha_for_speedup, in_run_costs, predict

RESULTS = Path(__file__).resolve().parent / "results"
OUT = RESULTS / "calibration_inrun.json"
KINDS = {"AMD EPYC": ("bench_default_t0.json", "ksweep_default_t0.json"),
         "Intel Xeon": ("bench_default_t0_intel.json", "archive/bench_autok_t0_intel.json")}
METHODS = ("chain", "hybrid")
TARGET = 2.5
MIX_STYLES = ("all", "chat", "magpie", "code", "math")  # the mixture's validation split, by prompt style


def _mean_abs(xs: list[float]) -> float | None:
    return sum(abs(x) for x in xs) / len(xs) if xs else None


def _load(results: Path, name: str, kind: str) -> dict:
    path = results / name
    if not path.is_file():
        raise UsageError(f"{path} does not exist; restore it from git (git checkout {path.relative_to(results.parents[1])})")
    d = json.loads(path.read_text())
    cpu = (d.get("machine") or {}).get("cpu") or ""
    if d.get("format") != "specdec-bench/1" or not cpu.startswith(kind.split()[0]):
        raise UsageError(f"{path} is not a specdec-bench/1 run on an {kind} (cpu {cpu!r}); restore it from git")
    return d


def forward_of(d: dict) -> str:
    """The target forward a results file timed: 'lean' (``specdec_lesson.lean``) or 'hf' (Hugging Face's, the files
    written before the lean forward existed, which record no dispatch forward)."""
    return ((d.get("pair") or {}).get("dispatch") or {}).get("forward") or "hf"


def held_out(runs: list[dict], old: Profile | None) -> list[dict]:
    """Leave-one-prompt-out predictions of every chain / hybrid label of one file."""
    keys = sorted({(r["task"], r["prompt_id"]) for r in runs})
    labels = sorted({r["label"] for r in runs if r["method"] in METHODS})
    rows = []
    for task, pid in keys:
        costs = in_run_costs(runs, exclude=[(task, pid)])
        mine = [r for r in runs if r["task"] == task and r["prompt_id"] == pid]
        ar = [r for r in mine if r["label"] == "ar"]
        for label in labels:
            rs = [r for r in mine if r["label"] == label]
            cells = paired_cells(runs, task, label).get(pid)
            measured = prompt_speedup(cells) if cells else None
            if not rs or not ar or measured is None:
                continue
            p = predict(costs, rs, ar)
            row = {"task": task, "prompt_id": pid, "method": rs[0]["method"], **p, "measured": measured,
                   "error": p["predicted"] / measured - 1, "error_decode_only": p["predicted_decode_only"] / measured - 1,
                   "error_iid": None if p["predicted_iid"] is None else p["predicted_iid"] / measured - 1}
            if old is not None and rs[0]["method"] == "chain":
                row["old_profile"] = predict_speedup(old, p["k"], tokens_per_step=p["tokens_per_step"])
                row["error_old_profile"] = row["old_profile"] / measured - 1
            rows.append(row)
    return rows


def _errors(rows: list[dict]) -> dict:
    out = {}
    for method in METHODS:
        rs = [r for r in rows if r["method"] == method]
        out[method] = {"n": len(rs), "mean_abs_error": _mean_abs([r["error"] for r in rs]),
                       "mean_error": sum(r["error"] for r in rs) / len(rs) if rs else None,
                       "max_abs_error": max((abs(r["error"]) for r in rs), default=None),
                       "mean_abs_error_decode_only": _mean_abs([r["error_decode_only"] for r in rs]),
                       "mean_abs_error_iid": _mean_abs([r["error_iid"] for r in rs if r["error_iid"] is not None]),
                       "mean_abs_error_old_profile": _mean_abs([r["error_old_profile"] for r in rs if "error_old_profile" in r])}
    return out


def redo_draft_vocab(dv: dict, costs, kinds: tuple[str, ...] = ("code", "math"), ref_n: int | None = None) -> dict:
    """A draft_vocab file's theory.speedup(alpha, K, c, T(K+1)/T(1)) with in-run costs, per style in ``kinds``:
    c = draft(K) x ms[N] / ms[ref] / (K t_plain), verify_ratio = (T(K + 1) + overhead) / t_plain.  ``ref`` is the
    subset whose head size the runs' draft had (``ref_n``, from the runs' ``draft_weights``: their in-run draft cost
    is that head's), else the file's ``shipped-N`` subset (files made before the runs named their draft)."""
    k = int(dv["k"])
    shipped = [n for n in dv["subsets"] if n.startswith("shipped-")]
    if len(shipped) != 1:
        raise UsageError("draft_vocab.json has no single 'shipped-N' subset; restore it from git")
    same = [n for n, s in dv["subsets"].items() if ref_n is not None and s["n"] == ref_n]
    ref = same[0] if same else shipped[0]
    ms0 = dv["subsets"][ref]["draft_ms_per_token"]
    over = costs.overhead.get(f"chain-k{k}", 0.0)
    ratio = (costs.T(k + 1) + over) / costs.t_plain
    out = {}
    for name, s in dv["subsets"].items():
        draft = costs.draft_cost(k) * s["draft_ms_per_token"] / ms0
        c = draft / (k * costs.t_plain)
        pred = {kind: theory.speedup(s["offline"][kind]["alpha_tok"], k, c, ratio) for kind in kinds}
        out[name] = {"n": s["n"], "draft_ms_per_token_probe": s["draft_ms_per_token"], "draft_s_per_step_inrun": draft,
                     "c_inrun": c, "predicted_speedup_inrun": pred, "predicted_speedup_probe": s["predicted_speedup"]}
    best = {kind: max(out, key=lambda n: out[n]["predicted_speedup_inrun"][kind]) for kind in kinds}
    return {"k": k, "verify_ratio_probe": dv["verify_ratio"], "verify_ratio_inrun": ratio,
            "verify_ratio_inrun_without_overhead": costs.T(k + 1) / costs.t_plain, "overhead_s": over,
            "reference_subset": ref, "draft_s_per_step_shipped_inrun": costs.draft_cost(k),
            "draft_s_per_step_shipped_probe": k * ms0 / 1e3,
            "subsets": out, "best_inrun": best, "best_probe": dv.get("best")}


def compute(results: Path = RESULTS) -> dict:
    """Everything the output file holds, from the committed files under ``results``."""
    calib = json.loads((results / "calibration.json").read_text())
    old = Profile.from_dict(calib["profile"])
    out: dict = {"what": "cost model calibrated on the runs' own counters (specdec_lesson.sim.runcost), "
                         "leave-one-prompt-out predictions vs measured paired speedups (issue 27)",
                 "target_speedup": TARGET, "kinds": {}}
    pooled_by_kind, head_n = {}, {}
    for kind, names in KINDS.items():
        files, all_runs, rows_kind = {}, [], []
        loaded = {name: _load(results, name, kind) for name in names}
        first = forward_of(loaded[names[0]])
        for name, d in loaded.items():
            runs = d["runs"]
            rows = held_out(runs, old)
            pooled_here = forward_of(d) == first
            files[name] = {"forward": forward_of(d), "pooled": pooled_here, "costs": in_run_costs(runs).to_dict(),
                           "held_out": _errors(rows), "predictions": rows}
            if pooled_here:  # one baseline per pool: a lean file's step costs are not a Hugging Face file's
                all_runs += runs
                rows_kind += rows
        pooled = pooled_by_kind[kind] = in_run_costs(all_runs)
        head_n[kind] = ((loaded[names[0]].get("pair") or {}).get("draft_weights") or {}).get("n_sub")
        n_max = max(pooled.verify_points)
        if pooled.draft_fit is not None:
            ks, ks_ext = list(range(1, n_max)), list(range(1, 9))
            where, where_ext = f"1..{n_max - 1} (T(K+1) measured or interpolated)", f"1..8 (T(n) beyond n = {n_max} extrapolated)"
        else:  # chain runs at one K only: no draft-cost fit, so only that K
            ks = ks_ext = sorted(pooled.draft)
            where = where_ext = f"{ks} only (chain runs at one K: no fit of the draft's cost in K)"
        need = alpha_for_speedup(TARGET, pooled, ks)
        need_ext = alpha_for_speedup(TARGET, pooled, ks_ext)
        out["kinds"][kind] = {
            "files": files, "forward": first, "costs_pooled": pooled.to_dict(), "held_out": _errors(rows_kind),
            "alpha_for_2_5x": {**need, "ks": where},
            "alpha_for_2_5x_k_up_to_8": {**need_ext, "ks": where_ext},
        }
    out["old_probe_profile"] = {
        "file": "calibration.json", "machine": calib.get("machine"),
        "its_own_test_runs_mean_abs_error": _mean_abs([r["relative_error"] for r in calib["test_runs"]]),
        "its_own_test_runs_mean_abs_error_iid": _mean_abs([r["relative_error_iid_alpha"] for r in calib["test_runs"]]),
        "T5_over_plain": old.T(5) / old.t_baseline if old.t_baseline else None,
        "note": "error_old_profile in predictions: predict_speedup(that profile, K, tokens_per_step=tau) on the same "
                "prompts as the in-run model (it was probed on an AMD EPYC; on the Intel files it is another machine's)",
    }
    dv = json.loads((results / "draft_vocab.json").read_text())
    out["draft_vocab_redone"] = {"machine_kind": "AMD EPYC", **redo_draft_vocab(dv, pooled_by_kind["AMD EPYC"])}
    mix = results / "draft_vocab_mixture_intel.json"  # the subset re-chosen on the mixture's validation split
    if mix.is_file():
        dvm = json.loads(mix.read_text())
        out["draft_vocab_mixture_redone"] = {"file": mix.name, "machine_kind": "Intel Xeon",
                                             **redo_draft_vocab(dvm, pooled_by_kind["Intel Xeon"], MIX_STYLES,
                                                                ref_n=head_n["Intel Xeon"])}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = OneLineParser(prog="calibrate_inrun.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--force", action="store_true", help="replace an existing --out file")
    try:
        a = ap.parse_args(argv)
        if a.out.exists() and not a.force:
            raise UsageError(f"{a.out} exists: pass --force to replace it, or choose another --out")
        check_output_file(a.out, "--out")
        result = compute()
    except UsageError as exc:
        print(f"calibrate_inrun.py: error: {exc}", file=sys.stderr)
        return 2
    result["created"] = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    write_results(result, a.out)
    for kind, k in result["kinds"].items():
        e, c = k["held_out"], k["costs_pooled"]
        print(f"{kind}: t_plain {1e3 * c['t_plain']:.1f} ms, T(n)/t_plain {c['verify_ratio_fit']}, "
              f"draft fit {c['draft_fit']}, held-out mean |error| chain {e['chain']['mean_abs_error']:.3f} "
              f"(old probe {e['chain']['mean_abs_error_old_profile']:.3f}), hybrid {e['hybrid']['mean_abs_error']:.3f}; "
              f"2.5x needs alpha {k['alpha_for_2_5x']['alpha']:.3f} at K = {k['alpha_for_2_5x']['k']}")
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
