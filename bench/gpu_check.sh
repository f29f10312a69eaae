#!/usr/bin/env bash
# The one prepared GPU check (for the session's `device` tool, or any CUDA machine):
# the CUDA tests of the train layer, then bench/gpu.py (the daemon's inner loop against a
# bare PyTorch loop). Run from the repository root; everything lands in $OUT.
#
#   bash bench/gpu_check.sh            # PYTHON=python3 by default; needs torch with CUDA,
#                                      # numpy and pytest (wheels in .whl/ are installed)
set -uo pipefail
OUT="${OUT:-/tmp/gaslocd-gpu}"
PY="${PYTHON:-python3}"
mkdir -p "$OUT"
if [ -d .whl ]; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl \
        && export PYTHONPATH=/tmp/site
fi
export PYTHONUNBUFFERED=1
nvidia-smi 2>&1 | tee "$OUT/nvidia-smi.txt"
"$PY" -c 'import torch; print(torch.__version__, torch.version.cuda, torch.cuda.is_available())' \
    2>&1 | tee "$OUT/torch.txt"
# The project's pytest settings need plugins the GPU machine may lack: plain options here.
"$PY" -m pytest -q -p no:cacheprovider -o addopts="" -c /dev/null --rootdir . \
    tests/train/test_cuda.py tests/train/test_device.py 2>&1 | tee "$OUT/tests.txt"
tests=${PIPESTATUS[0]}
"$PY" bench/gpu.py --out "$OUT" 2>&1 | tee "$OUT/bench.txt"
bench=${PIPESTATUS[0]}
echo "tests exit $tests, bench exit $bench" | tee "$OUT/summary.txt"
[ "$tests" = 0 ] && [ "$bench" = 0 ]
