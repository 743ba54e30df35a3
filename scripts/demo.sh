#!/usr/bin/env bash
# The main job on the embedded default: synthesise the tiny GLM-5 model and
# generate from it on the CPU (serving mode: caches in vLLM's layouts, MTP on).
set -euo pipefail
BIN=${1:-./tilert}
DIR=${2:-.demo}
MODEL="$DIR/glm-5-tiny"
if [ ! -f "$MODEL/config.json" ]; then
  "$BIN" synth --preset glm-5-tiny --out "$MODEL" --seed 0
fi
"$BIN" generate --model-dir "$MODEL" --prompt "The decode engine streams tokens" \
  --max-tokens 32 --mode serving --mtp
