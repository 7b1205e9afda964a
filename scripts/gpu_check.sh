#!/usr/bin/env bash
# The GPU check, for a machine with a CUDA GPU: the tiny-model lossless and sampling suites on the
# device in float32 and bfloat16 (PLAYGROUND_DEVICE / PLAYGROUND_DTYPE, honoured by the tiny models
# of tests/helpers.py), then every method on small random models against the baseline with a short
# benchmark (scripts/gpu_check.py). No downloads. Exits non-zero on any mismatch beyond a
# classified near-tie; exit code 3 when CUDA is absent.
#   scripts/gpu_check.sh                      CUDA, float32 and bfloat16
#   scripts/gpu_check.sh --device cpu --quick the CPU dry run (float32, no pytest suites)
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
device=cuda quick=0
while [ $# -gt 0 ]; do
  case "$1" in
    --device) device=$2; shift 2 ;;
    --quick) quick=1; shift ;;
    *) echo "gpu_check: unknown option $1 (options: --device DEVICE, --quick)" >&2; exit 2 ;;
  esac
done
if [ "${device%%:*}" = cuda ] && ! "$PYTHON" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  echo "gpu_check: CUDA is not available on this machine; nothing was checked (try --device cpu --quick)" >&2
  exit 3
fi
if [ "$quick" = 1 ]; then
  exec "$PYTHON" scripts/gpu_check.py --device "$device" --dtypes float32 --quick
fi
status=0
for dtype in float32 bfloat16; do
  echo "== tiny-model suites on $device, $dtype"
  PLAYGROUND_DEVICE=$device PLAYGROUND_DTYPE=$dtype "$PYTHON" -m pytest -q -p no:cacheprovider \
    tests/test_sampling_methods.py tests/test_engine_lossless.py tests/test_drafter_failure_modes.py || status=1
done
echo "== every method on random models, with a short benchmark"
"$PYTHON" scripts/gpu_check.py --device "$device" --dtypes float32,bfloat16 || status=1
exit $status
