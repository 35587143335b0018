"""Calibrate the simulator on this machine and check its prediction against a measured run (issue 8).

    python benchmarks/calibrate.py [--quick]

1. Profile (calibration prompts): the target's verify curve T(n), n = 1..16, measured in isolation
   (``profiling.measure_verify_curve``); the draft's seconds per drafted token and the engine's
   per-step overhead from one speculative run on *calibration* prompts; plain decoding's seconds
   per token from an autoregressive run on the same prompts.
2. Prediction (test prompts, disjoint from the calibration prompts): each test run's acceptance
   statistics go into ``predict_speedup`` - its tokens per step tau (from the accepted-length
   histogram), and for comparison the i.i.d. closed form from its alpha; none of its timings.
3. Measurement: wall-clock tokens/s of ``speculative_generate`` over ``autoregressive_generate``
   on the test prompts, interleaved, medians over repeats.
Writes ``benchmarks/results/calibration.json`` (read by notebook 06) atomically.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time

import torch

from specdec_lesson.bench.tasks import chat, code_problems, format_code_prompt, format_math_prompt, math_problems
from specdec_lesson.drafters.pair import load_default_pair
from specdec_lesson.profiling import measure_verify_curve
from specdec_lesson.sim.calibrate import default_calibration_path, predict_speedup, profile_from_stats, save_calibration
from specdec_lesson.speculative import autoregressive_generate, speculative_generate


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--k", type=int, default=None, help="drafts per step (default: the draft's default K)")
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    pair = load_default_pair()
    target, drafter, tok = pair.target, pair.draft, pair.tokenizer
    k = args.k or getattr(drafter, "default_k", 4)
    code, math = code_problems("eval"), math_problems()
    enc = lambda text: tok(chat(tok, text), return_tensors="pt").input_ids  # noqa: E731
    calib = [enc(format_code_prompt(code[0])), enc(format_math_prompt(math[0]))]
    n_test = 1 if args.quick else 3
    tests = [("code", enc(format_code_prompt(p))) for p in code[1:1 + n_test]]
    tests += [("math", enc(format_math_prompt(p))) for p in math[1:1 + n_test]]
    N = 32 if args.quick else args.max_new_tokens

    for ids in calib[:1]:  # warm-up
        autoregressive_generate(target, ids, 8)
        speculative_generate(target, drafter, ids, 8, k=k)
    context = int(statistics.mean(ids.shape[1] for ids in calib)) + N // 2
    curve = measure_verify_curve(target, n_max=16, context=context, repeats=3 if args.quick else 5)
    specs, bases = [], []
    for ids in calib:
        bases.append(autoregressive_generate(target, ids, N)[1])
        specs.append(speculative_generate(target, drafter, ids, N, k=k)[1])
    # pool the calibration runs' counters
    spec, base = specs[0], bases[0]
    for s in specs[1:]:
        for f in ("proposed", "accepted", "rejections", "emitted", "row_steps", "time_draft", "time_verify", "time_other"):
            setattr(spec, f, getattr(spec, f) + getattr(s, f))
    for b in bases[1:]:
        for f in ("emitted", "time_draft", "time_verify", "time_other"):
            setattr(base, f, getattr(base, f) + getattr(b, f))
    profile = profile_from_stats(spec, curve, baseline=base)
    print(f"profile: T(1) {1e3 * curve[1]:.1f} ms, T({k + 1}) {1e3 * curve[k + 1]:.1f} ms, "
          f"draft {1e3 * profile.t_draft:.2f} ms/token (c = {profile.c:.3f}), "
          f"overhead {1e3 * profile.overhead:.2f} ms/step, plain {1e3 * profile.t_baseline:.1f} ms/token")

    rows = []
    for task, ids in tests:
        walls = {"ar": [], "spec": []}
        alphas, taus = [], []
        for rep in range(args.repeats):
            for method in (("ar", "spec") if rep % 2 == 0 else ("spec", "ar")):
                t0 = time.perf_counter()
                if method == "ar":
                    out, _ = autoregressive_generate(target, ids, N)
                else:
                    out, st = speculative_generate(target, drafter, ids, N, k=k)
                    alphas.append(st.alpha)
                    taus.append(st.tau)
                walls[method].append(len(out[0]) / (time.perf_counter() - t0))
        measured = statistics.median(walls["spec"]) / statistics.median(walls["ar"])
        alpha, tau = statistics.median(alphas), statistics.median(taus)
        iid = predict_speedup(profile, k, alpha)  # closed form: independent acceptance at rate alpha
        predicted = predict_speedup(profile, k, tokens_per_step=tau)  # the run's own accepted-length profile
        rows.append({"task": task, "alpha": alpha, "tau": tau, "predicted": predicted, "predicted_iid_alpha": iid,
                     "measured": measured, "relative_error": predicted / measured - 1,
                     "relative_error_iid_alpha": iid / measured - 1})
        print(f"{task}: alpha {alpha:.3f} tau {tau:.2f}  predicted {predicted:.2f}x (i.i.d.-alpha closed form {iid:.2f}x)  "
              f"measured {measured:.2f}x  error {100 * (predicted / measured - 1):+.1f}% ({100 * (iid / measured - 1):+.1f}%)",
              flush=True)
    pred = statistics.mean(r["predicted"] for r in rows)
    meas = statistics.mean(r["measured"] for r in rows)
    path = default_calibration_path()
    tmp = path.with_suffix(".tmp")
    save_calibration(tmp, profile, k, measured_speedup=meas, predicted_mean=pred, test_runs=rows,
                     machine=platform.platform(), cpus=os.cpu_count(), threads=torch.get_num_threads(),
                     torch=torch.__version__, date=time.strftime("%Y-%m-%d %H:%M"), max_new_tokens=N,
                     method="timings from calibration prompts; test prompts contribute acceptance statistics only")
    os.replace(tmp, path)
    print(f"mean predicted {pred:.2f}x vs measured {meas:.2f}x ({100 * (pred / meas - 1):+.1f}%); wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
