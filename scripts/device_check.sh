#!/usr/bin/env bash
# The whole GPU session in one script, for a lent CUDA machine (the image: Python 3.12, torch,
# transformers, numpy, matplotlib, pytest, hypothesis; no Jupyter, no gguf, no network; the working
# tree only). Prints the versions, runs the CUDA tests, then gpu-check, all into $OUT, within about
# 8 minutes (each phase has its own time limit, so a hung phase cannot eat the next one's time).
#
#   OUT=/some/folder scripts/device_check.sh
#   OUT=/tmp/dc DEVICE=cpu GPU_CHECK_ARGS=--tiny scripts/device_check.sh   (a dry run of the script on a CPU)
#
# Leaves in $OUT: device_check.log (everything printed), cuda-tests.log, gpu-<name>.json (rewritten
# after every section: a run cut short keeps what it measured) and its gpu-<name>-regimes-*.png figures.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:?set OUT to the folder the results go to}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/device_check.log") 2>&1
export PYTHONPATH="$PWD/src:$PWD" INFERENCE_INTERNALS_SKIP_REAL=1 KINETO_LOG_LEVEL=6
unset INFERENCE_INTERNALS_MODEL
start=$(date +%s)
phase() { echo; echo "=== $1 ($(( $(date +%s) - start )) s in)"; }

phase "versions"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | head -4
"$PY" - <<'PY'
import importlib, platform
print("python", platform.python_version())
for name in ("torch", "transformers", "numpy", "matplotlib", "safetensors", "pytest", "hypothesis"):
    try:
        print(f"{name:13s}", importlib.import_module(name).__version__)
    except Exception as e:  # noqa: BLE001
        print(f"{name:13s}", "MISSING:", type(e).__name__, e)
import torch
print("cuda", torch.version.cuda, "available:", torch.cuda.is_available(),
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")
PY

# The library's device paths on the GPU, and the CUDA-graph and device tests (90 s at most).
phase "CUDA tests"
timeout -k 5 90 "$PY" -m pytest tests/test_cuda.py tests/test_cuda_graph.py tests/test_device_paths.py \
    -q -p no:cacheprovider --hypothesis-profile=repeatable -x 2>&1 | tee "$OUT/cuda-tests.log" | tail -25
echo "CUDA tests exit status: ${PIPESTATUS[0]}"

# gpu-check: the engine checks in fp32 and bf16, the measurements and figures, then the unit tests on
# CUDA (120 s at most, their process group killed past it). 330 s at most; SIGTERM leaves the JSON as
# far as it got.
phase "gpu-check"
timeout -k 10 330 "$PY" scripts/gpu_check.py --device "${DEVICE:-cuda}" --tests-timeout 120 --out "$OUT" ${GPU_CHECK_ARGS:-}
echo "gpu-check exit status: $?"
phase "done"
ls -l "$OUT"
