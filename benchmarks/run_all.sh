#!/usr/bin/env bash
# Every committed benchmark result, in one run on a quiet machine (about 130 minutes on 2 CPU cores).
# Every (prompt, method) repeats 3 times, interleaved; tables give medians and spreads.
#   bash benchmarks/run_all.sh
set -euo pipefail
cd "$(dirname "$0")/.."
R=benchmarks/results
mkdir -p "$R"
if [ "${1:-}" != "--skip-done" ]; then
  python benchmarks/verify_curve.py --threads 2 --out "$R/verify_curve.json"
  python benchmarks/engine.py --prompts 2 --repeats 3 --force --out "$R/engine.json"
fi
python benchmarks/lean_vs_hf.py --force  # the lean forward against Hugging Face's: T(n) and plain decoding
python benchmarks/gemv_bandwidth.py --force  # the one-row products' read rate; a decode step taken apart
python benchmarks/compile_probe.py --force --out "$R/compile_probe.json"  # does torch.compile pay for the lean forward?
# the headline: four held-out prompt styles (HumanEval-like code, free-form function requests, math word problems,
# general chat questions), 12 prompts each, 3 interleaved repeats; the adaptive method picks K per step, the adaptive
# tree its depth and node count
python -m specdec_lesson.bench --pair default --task code,requests,math,chat --limit 12 --repeats 3 --k 4 --threads 2 \
  --method ar,chain,hybrid,adaptive,hybrid-tree,adaptive-tree,prompt-lookup,hf-prompt-lookup --max-new-tokens 96 \
  --no-progress --force --out "$R/bench_default_t0.json"
# the K sweep (K = 1..6) for the distilled draft alone and for the hybrid, against the simulator's S(K) in notebook 07
# (not a bench_*.json: notebook 07's headline stays the run above)
python -m specdec_lesson.bench --pair default --task code,math --limit 5 --repeats 3 --k 1,2,3,4,5,6 --threads 2 \
  --method ar,chain,hybrid --max-new-tokens 96 --no-progress --force --out "$R/ksweep_default_t0.json"
python -m specdec_lesson.bench --pair default --task code,requests,math,chat --limit 12 --repeats 3 --k 4 --threads 2 \
  --method ar,chain,hybrid,adaptive,adaptive-tree --temperature 0.7 --max-new-tokens 96 \
  --no-progress --force --out "$R/bench_default_t07.json"
python -m specdec_lesson.bench --report "$R/bench_default_t0.json"
python -m specdec_lesson.bench --report "$R/bench_default_t07.json"
# trees against chains, trees of draft + lookup candidates, block vs token verification (T = 0.7 / 1.0), four styles
# each; the committed runs of these three were made on an Intel Xeon and carry its suffix (_intel.json)
python benchmarks/tree_vs_chain.py --threads 2 --prompts 2 --max-new 40 --repeats 3 --out "$R/tree_vs_chain.json"
python benchmarks/hybrid_tree.py --threads 2 --out "$R/hybrid_tree.json"
python benchmarks/block_verify.py --threads 2 --out "$R/block_verify.json"
# the draft's vocabulary subset by acceptance per millisecond (held-out set: the target's answers to 10 + 10 eval prompts)
python -m specdec_lesson.distill heldout --out runs/distill --n-code 10 --n-math 10 --threads 2
python benchmarks/draft_vocab.py --heldout runs/distill/heldout.pt --out "$R/draft_vocab.json"
python benchmarks/calibrate.py --repeats 3
# lookup over the target's own past answers (drafters.suffix, corpus specdec_lesson/data/answers_smollm2.npz) beside the hybrid,
# on all three prompt styles (code, math, free-form function requests)
python -m specdec_lesson.bench --pair default --task code,math,requests --limit 3 --repeats 3 --k 4 --threads 2 \
  --method ar,hybrid,hybrid-suffix,suffix --max-new-tokens 96 --no-progress --force --out "$R/suffix_lookup.json"
