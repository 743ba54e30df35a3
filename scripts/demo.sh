#!/usr/bin/env bash
# The main job on the embedded default: synthesise the tiny GLM-5 model and
# generate from it on the CPU (serving mode: caches in vLLM's layouts, MTP on).
# Then the disaggregated path on the same model: a decode node on free ports,
# a local prefill whose state is handed to it over the ctrl protocol and the
# tcp transfer engine, and the node's NDJSON token stream.
set -euo pipefail
BIN=${1:-./tilert}
DIR=${2:-.demo}
MODEL="$DIR/glm-5-tiny"
if [ ! -f "$MODEL/config.json" ]; then
  "$BIN" synth --preset glm-5-tiny --out "$MODEL" --seed 0
fi
"$BIN" generate --model-dir "$MODEL" --prompt "The decode engine streams tokens" \
  --max-tokens 32 --mode serving --mtp

echo
echo "== decode node: prefill here, state over the ctrl port + tcp transfer engine, tokens from /pd/decode"
ADDR="$DIR/decode-addr.json"
LOG="$DIR/decode.log"
stop_node() {
  if [ -n "${NODE:-}" ] && kill -0 "$NODE" 2>/dev/null; then
    kill -TERM "$NODE" 2>/dev/null || true
    wait "$NODE" 2>/dev/null || true
  fi
}
trap stop_node EXIT
# The config wants fixed ports: pick random high ones and try again when one
# is taken (the node says so and exits).
started=""
for _try in 1 2 3 4 5; do
  CTRL=$((20000 + RANDOM % 20000))
  HTTP=$((CTRL + 1 + RANDOM % 1000))
  rm -f "$ADDR"
  "$BIN" decode --device cpu --model glm5 --model-weights-dir "$MODEL" --with-mtp --max-seq-len 1024 \
    --host 127.0.0.1 --ctrl-port "$CTRL" --http-port "$HTTP" --transfer-listen 127.0.0.1:0 \
    --addr-file "$ADDR" >"$LOG" 2>&1 &
  NODE=$!
  for _ in $(seq 1 300); do
    { [ -f "$ADDR" ] || ! kill -0 "$NODE" 2>/dev/null; } && break
    sleep 0.1
  done
  if [ -f "$ADDR" ]; then
    started=1
    break
  fi
  stop_node
  grep -q "address already in use" "$LOG" || break
done
if [ -z "$started" ]; then
  echo "the decode node did not start:" >&2
  cat "$LOG" >&2
  exit 1
fi
echo "node: $(cat "$ADDR")"
"$BIN" dev-prefill --model-dir "$MODEL" --addr-file "$ADDR" \
  --prompt "The decode engine streams tokens" --max-tokens 32
stop_node
trap - EXIT
echo "node log:"
sed 's/^/  /' "$LOG"
