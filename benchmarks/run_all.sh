#!/usr/bin/env bash
# Every committed benchmark result, in one run on a quiet machine (about 40 minutes on 2 CPU cores).
#   bash benchmarks/run_all.sh
set -euo pipefail
cd "$(dirname "$0")/.."
R=benchmarks/results
mkdir -p "$R"
if [ "${1:-}" != "--skip-done" ]; then
  python benchmarks/verify_curve.py --threads 2 --out "$R/verify_curve.json"
  python benchmarks/engine.py --prompts 2 --repeats 2 --out "$R/engine.json"
fi
python -m specdec_lesson.bench --pair default --task code,math --limit 8 --repeats 1 --k 4 --threads 2 \
  --method ar,chain,hybrid,prompt-lookup,hf,hf-assisted,hf-prompt-lookup --max-new-tokens 96 --no-progress \
  --out "$R/bench_default_t0.json"
# best K for the distilled draft alone and for the hybrid (not a bench_*.json: notebook 07's headline stays the run above)
python -m specdec_lesson.bench --pair default --task code,math --limit 5 --repeats 1 --k 2,3,5,6 --threads 2 \
  --method ar,chain,hybrid --max-new-tokens 96 --no-progress --out "$R/ksweep_default_t0.json"
python -m specdec_lesson.bench --pair default --task code,math --limit 5 --repeats 1 --k 4 --threads 2 \
  --method ar,chain,hybrid --temperature 0.7 --max-new-tokens 96 --no-progress --out "$R/bench_default_t07.json"
python -m specdec_lesson.bench --report "$R/bench_default_t0.json"
python -m specdec_lesson.bench --report "$R/bench_default_t07.json"
python benchmarks/tree_vs_chain.py --threads 2 --prompts 2 --max-new 64 --out "$R/tree_vs_chain.json"
python benchmarks/calibrate.py --repeats 2
