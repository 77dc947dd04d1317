#!/usr/bin/env bash
# The GPU checks in one go, on a machine with an NVIDIA GPU, CUDA's nvcc, torch (CUDA), cmake, ninja and
# pybind11 (no network needed). Designed for one H200 in well under 8 minutes:
#   1. builds pycoll._C in place for sm_90 only (PYCOLL_CUDA=on: no nvcc is an error, not a CPU build),
#   2. runs the GPU tests: pytest -m gpu tests/gpu,
#   3. runs the kernel benchmark: bench/gpu_kernels.py (--quick: its short run),
#   4. prints one summary: tests passed / failed / skipped per file, then the kernel table.
# Exits non-zero when the build, a test or the benchmark fails, when no GPU test ran, or when GPU tests
# were skipped although a GPU is present (a skip must never pass for a success there), except those that
# need more GPUs than the machine has (their skip reason begins "needs N GPUs").
#
#   bash scripts/gpu_check.sh [--quick]
#
# Logs (build, tests, junit xml, benchmark) go to $GPU_CHECK_LOGS, default a new folder under /tmp.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PY=${PYTHON:-python3}
LOGS=${GPU_CHECK_LOGS:-$(mktemp -d /tmp/pycoll-gpu-check.XXXXXX)}
mkdir -p "$LOGS"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
BENCH_ARGS=()
if [[ "${1:-}" == "--quick" ]]; then BENCH_ARGS+=(--quick); fi
if ! command -v nvcc >/dev/null 2>&1 && [[ -x /usr/local/cuda/bin/nvcc ]]; then
  export PATH=/usr/local/cuda/bin:$PATH
fi
start=$(date +%s)
failures=()

echo "=== gpu_check: logs in $LOGS"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || echo "(no nvidia-smi)"
nvcc --version 2>/dev/null | tail -1 || echo "(no nvcc on PATH)"

echo "=== build: PYCOLL_CUDA=on PYCOLL_CUDA_ARCHS=90 setup.py build_ext --inplace"
t=$(date +%s)
if ! PYCOLL_CUDA=on PYCOLL_CUDA_ARCHS=90 CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" \
    "$PY" setup.py build_ext --inplace >"$LOGS/build.log" 2>&1; then
  tail -n 40 "$LOGS/build.log"
  echo "gpu_check: FAILED: the build (full log: $LOGS/build.log)"
  exit 1
fi
echo "built in $(( $(date +%s) - t )) s"
"$PY" - <<'EOF'
from pycoll import _C
print(f"pycoll._C.cuda: built={_C.cuda.built()} devices={_C.cuda.device_count()} {_C.cuda.device_error()}")
EOF

# Is there a GPU, whatever pycoll or torch make of it?
gpu_present=0
if nvidia-smi -L 2>/dev/null | grep -q "^GPU "; then gpu_present=1; fi
if "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then gpu_present=1; fi

echo "=== GPU tests: pytest -m gpu tests/gpu"
t=$(date +%s)
timeout -k 10 420 "$PY" -m pytest -m gpu tests/gpu -q -rs -p no:cacheprovider \
  --junitxml="$LOGS/gpu-tests.xml" 2>&1 | tee "$LOGS/gpu-tests.log"
test_rc=${PIPESTATUS[0]}
echo "tests took $(( $(date +%s) - t )) s (exit $test_rc)"
if [[ $test_rc -ne 0 ]]; then failures+=("GPU tests (pytest exit $test_rc)"); fi

echo "=== kernel benchmark: bench/gpu_kernels.py ${BENCH_ARGS[*]:-}"
bench_rc=0
if [[ $gpu_present -eq 1 ]]; then
  timeout -k 10 240 "$PY" bench/gpu_kernels.py ${BENCH_ARGS[@]+"${BENCH_ARGS[@]}"} 2>&1 | tee "$LOGS/bench.log"
  bench_rc=${PIPESTATUS[0]}
  if [[ $bench_rc -ne 0 ]]; then failures+=("benchmark (exit $bench_rc)"); fi
else
  echo "no GPU: benchmark not run" | tee "$LOGS/bench.log"
fi

echo
echo "=== summary"
"$PY" - "$LOGS/gpu-tests.xml" "$gpu_present" <<'EOF' || failures+=("GPU tests skipped or absent")
import os
import re
import sys
import xml.etree.ElementTree as ET

path, gpu_present = sys.argv[1], sys.argv[2] == "1"
counts = {}
if os.path.exists(path):
    for case in ET.parse(path).getroot().iter("testcase"):
        cls = case.get("classname", "?")
        parts = cls.split(".")  # tests.gpu.test_kernels[.TestGpuKernels]: the file is a prefix
        files = ["/".join(parts[:k]) + ".py" for k in range(len(parts), 0, -1)]
        name = next((f for f in files if os.path.exists(f)), cls)
        outcome = "passed"
        for child in case:
            if child.tag == "skipped":
                # A test that needs more GPUs than the machine has skips with "needs N GPUs": not a failure.
                more_gpus = re.match(r"needs (two|three|four|\d+) GPUs", child.get("message", ""))
                outcome = "more GPUs" if more_gpus else "skipped"
            elif child.tag in ("failure", "error"):
                outcome = "failed"
        row = counts.setdefault(name, {"passed": 0, "failed": 0, "skipped": 0, "more GPUs": 0})
        row[outcome] += 1
print(f"{'test file':<40} {'passed':>7} {'failed':>7} {'skipped':>8} {'needs more GPUs':>16}")
for name, row in sorted(counts.items()):
    print(f"{name:<40} {row['passed']:>7} {row['failed']:>7} {row['skipped']:>8} {row['more GPUs']:>16}")
passed = sum(r["passed"] for r in counts.values())
skipped = sum(r["skipped"] for r in counts.values())
if gpu_present and skipped:
    print(f"gpu_check: {skipped} GPU tests were SKIPPED although a GPU is present (reasons above, -rs)")
    sys.exit(1)
if passed == 0:
    print("gpu_check: no GPU test passed" + ("" if gpu_present else " (no GPU on this machine)"))
    sys.exit(1)
EOF
echo
cat "$LOGS/bench.log"
echo
if [[ ${#failures[@]} -gt 0 ]]; then
  printf 'gpu_check: FAILED: %s\n' "${failures[@]}"
  echo "gpu_check: took $(( $(date +%s) - start )) s; logs in $LOGS"
  exit 1
fi
echo "gpu_check: OK in $(( $(date +%s) - start )) s; logs in $LOGS"
