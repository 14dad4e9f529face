#!/usr/bin/env bash
# The benchmark on a GPU machine, in one command: every scenario x system of `python -m bench live`, with
# deploy/gpu.yaml's gateway and Ray Serve LLM baselines sized to the GPUs found, on a real model folder,
# within a time budget (what has run by then is kept: results.json is written after every system).
#
#   bash bench/gpu.sh /models/Meta-Llama-3.1-8B-Instruct [BUDGET_S (default 3000)] [bench live options...]
#
# e.g. `bash bench/gpu.sh /models/llama-8b 1200 --scenarios bench/scenarios/burst.yaml --systems baseline,gateway`.
# Results: bench/results/gpu/ (summary.md, results.json, plots; each deployment's log under deployments/).
set -euo pipefail
MODEL=${1:?usage: bash bench/gpu.sh MODEL_FOLDER [BUDGET_S] [bench live options...]}
BUDGET=${2:-3000}
shift $(( $# >= 2 ? 2 : 1 ))
cd "$(dirname "${BASH_SOURCE[0]}")/.."
GPUS=$(nvidia-smi -L | grep -c '^GPU ')
echo "[gpu.sh] $GPUS GPU(s), model $MODEL, budget ${BUDGET}s" >&2
export FLEETGATE_EXTRAS=${FLEETGATE_EXTRAS:-gpu,test,bench}
source scripts/setup.sh
OUT=bench/results/gpu
python -m bench.gpu_configs --gpus "$GPUS" --out "$OUT/configs"
timeout --signal=INT --kill-after=120 "$BUDGET" python -m bench live --config "$OUT/configs/gateway.yaml" \
  --baseline-config "$OUT/configs/baseline.yaml" --model "$MODEL" --context-tokens 16384 --out "$OUT" "$@"
