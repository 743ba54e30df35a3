#!/usr/bin/env bash
# The main job on the embedded default: the tiny trained GLM-5-shaped model
# (testdata/models/glm-5-tiny-kjv, trained on the King James Bible by
# scripts/train_tiny.py; tiny-model quality) generates on the CPU (serving
# mode: caches in vLLM's layouts, MTP on; the MTP acceptance rate is printed).
# DEMO_MODEL=synth uses the random synthetic glm-5-tiny preset instead.
# Then the disaggregated path on the same model: a decode node on free ports,
# a local prefill whose state is handed to it over the ctrl protocol and the
# tcp transfer engine, and the node's NDJSON token stream. Last, the whole
# stack behind the OpenAI API: decode node + dev-vllm (the CPU stand-in for
# vLLM prefill + TileRT connector + sidecar) + tilert router, and requests
# through the router.
set -euo pipefail
BIN=${1:-./tilert}
DIR=${2:-.demo}
ROOT=$(cd "$(dirname "$0")/.." && pwd)

# --- the model: change this block to demo another one ----------------------
# MODEL is an HF checkpoint directory with tokenizer.json; NAME is the name
# the router serves it as; FAMILY the decode node's --model (glm5 or
# deepseek-v3.2); WEIGHTS_NOTE is the one line that says what the output can
# and cannot show.
PROMPT="And the LORD spake unto Moses, saying"
NAME=glm-5-tiny-kjv
FAMILY=glm5
MODEL="$ROOT/testdata/models/$NAME"
WEIGHTS_NOTE="note: $NAME is a tiny model trained on the King James Bible (scripts/train_tiny.py): expect repetitive KJV-style text; the demo proves the path: the local generation, the handed-over decode and the whole stack's answer are the same tokens."
if [ "${DEMO_MODEL:-}" = synth ]; then
  NAME=glm-5-tiny
  MODEL="$DIR/glm-5-tiny"
  PROMPT="The decode engine streams tokens"
  WEIGHTS_NOTE="note: $NAME has random weights (tilert synth), so its text is gibberish; the demo proves the plumbing: the local generation, the handed-over decode and the whole stack's answer are the same tokens."
  if [ ! -f "$MODEL/config.json" ]; then
    "$BIN" synth --preset glm-5-tiny --out "$MODEL" --seed 0
  fi
fi
# ----------------------------------------------------------------------------
mkdir -p "$DIR"
echo "$WEIGHTS_NOTE"
echo
echo "== local generation on the CPU: $NAME, serving mode, MTP on"
echo "prompt: $PROMPT"
"$BIN" generate --model-dir "$MODEL" --prompt "$PROMPT" \
  --max-tokens 32 --mode serving --mtp

echo
echo "== decode node: prefill here, state over the ctrl port + tcp transfer engine, tokens from /pd/decode"
# A fresh shared secret (docs/SECURITY.md): the node authenticates dev-prefill
# and dev-vllm on its ctrl and transfer ports and wants the router's token
# (derived from the secret) on /pd/*. Every port here is on loopback anyway.
SECRET="$DIR/secret"
( umask 077 && head -c 32 /dev/urandom | base64 > "$SECRET" )
chmod 600 "$SECRET"
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
  "$BIN" decode --device cpu --model "$FAMILY" --model-weights-dir "$MODEL" --with-mtp --max-seq-len 1024 \
    --host 127.0.0.1 --ctrl-port "$CTRL" --http-port "$HTTP" --transfer-listen 127.0.0.1:0 \
    --secret-file "$SECRET" --addr-file "$ADDR" >"$LOG" 2>&1 &
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
"$BIN" dev-prefill --model-dir "$MODEL" --addr-file "$ADDR" --secret-file "$SECRET" \
  --prompt "$PROMPT" --max-tokens 32

echo
echo "== the whole stack: router (OpenAI API) -> dev-vllm (CPU stand-in for vLLM prefill + connector) -> decode node"
VADDR="$DIR/vllm-addr.json"
RADDR="$DIR/router-addr.json"
VLOG="$DIR/dev-vllm.log"
RLOG="$DIR/router.log"
stop_all() {
  for p in "${ROUTER:-}" "${VLLM:-}"; do
    if [ -n "$p" ] && kill -0 "$p" 2>/dev/null; then
      kill -TERM "$p" 2>/dev/null || true
      wait "$p" 2>/dev/null || true
    fi
  done
  stop_node
}
trap stop_all EXIT
wait_file() { # file pid log
  for _ in $(seq 1 300); do
    { [ -f "$1" ] || ! kill -0 "$2" 2>/dev/null; } && break
    sleep 0.1
  done
  if [ ! -f "$1" ]; then
    echo "a process did not start:" >&2
    cat "$3" >&2
    exit 1
  fi
}
rm -f "$VADDR" "$RADDR"
"$BIN" dev-vllm --model-dir "$MODEL" --served-model-name "$NAME" --host 127.0.0.1 --port 0 \
  --secret-file "$SECRET" --addr-file "$VADDR" >"$VLOG" 2>&1 &
VLLM=$!
wait_file "$VADDR" "$VLLM" "$VLOG"
VURL="http://$(sed 's/.*"http":"\([^"]*\)".*/\1/' "$VADDR")"
# The config wants a fixed router port: random high ones, retried when taken.
for _try in 1 2 3 4 5; do
  RPORT=$((40000 + RANDOM % 20000))
  rm -f "$RADDR"
  "$BIN" router --vllm-url "$VURL" --decode "127.0.0.1:$CTRL:$HTTP" --model-path "$MODEL" \
    --host 127.0.0.1 --port "$RPORT" --secret-file "$SECRET" --addr-file "$RADDR" >"$RLOG" 2>&1 &
  ROUTER=$!
  for _ in $(seq 1 300); do
    { [ -f "$RADDR" ] || ! kill -0 "$ROUTER" 2>/dev/null; } && break
    sleep 0.1
  done
  [ -f "$RADDR" ] && break
  grep -q "address already in use" "$RLOG" || break
done
wait_file "$RADDR" "$ROUTER" "$RLOG"
RURL="http://$(sed 's/.*"http":"\([^"]*\)".*/\1/' "$RADDR")"
echo "router: $RURL  dev-vllm: $VURL  decode: 127.0.0.1:$CTRL:$HTTP"
if command -v curl >/dev/null; then
  echo
  body="{\"model\":\"$NAME\",\"prompt\":\"$PROMPT\",\"max_tokens\":32,\"temperature\":0}"
  echo "\$ curl $RURL/v1/completions -d '$body'"
  curl -sS "$RURL/v1/completions" -H 'Content-Type: application/json' -d "$body"
  echo
  echo "\$ curl -N $RURL/v1/chat/completions -d '{... \"stream\":true, \"stream_options\":{\"include_usage\":true}}'"
  curl -sSN "$RURL/v1/chat/completions" -H 'Content-Type: application/json' \
    -d "{\"model\":\"$NAME\",\"messages\":[{\"role\":\"user\",\"content\":\"Who is the LORD?\"}],\"max_tokens\":8,\"temperature\":0,\"stream\":true,\"stream_options\":{\"include_usage\":true}}"
  echo "\$ curl $RURL/metrics | grep ^tilert_router_requests_total"
  curl -sS "$RURL/metrics" | grep '^tilert_router_requests_total' | grep -v ' 0$' || true
else
  echo "curl is not installed; send requests to $RURL/v1/completions by hand"
fi
stop_all
trap - EXIT
echo "node log:"
sed 's/^/  /' "$LOG"
echo
echo "$WEIGHTS_NOTE"
