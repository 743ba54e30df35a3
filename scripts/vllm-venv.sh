#!/usr/bin/env bash
# Builds (once) the pinned venv `make test-vllm` runs in: real vLLM 0.33.0
# on a CPU-only machine. vLLM's scheduler, KV-cache planning and allocation,
# connector factory and worker-side connector wrapper import and run there;
# only the model forward needs a GPU, and the tests fake just that.
#
# Recipe: the regular torch 2.14.0 wheel (it imports and runs on CPU), vLLM
# without its dependencies, then vLLM's pure-Python requirements (its GPU
# kernel packages are left out: nothing on the tested path imports them).
# ~1.5 min and ~6.6 GB on a fast link.
#
# Usage: scripts/vllm-venv.sh [VENV]   (default $TILERT_VLLM_VENV or
# /opt/tilert-vllm-venv). Exit 0: the venv is ready (reused when its stamp
# matches). Non-zero: it could not be built; the last line says why.
set -euo pipefail
VENV=${1:-${TILERT_VLLM_VENV:-/opt/tilert-vllm-venv}}
TORCH=2.14.0
VLLM=0.33.0
STAMP="torch==$TORCH vllm==$VLLM pytest v1"

if [ -f "$VENV/.tilert-stamp" ] && [ "$(cat "$VENV/.tilert-stamp")" = "$STAMP" ] &&
  "$VENV/bin/python" -c 'import vllm, torch, pytest' >/dev/null 2>&1; then
  echo "vllm-venv: reusing $VENV ($STAMP)"
  exit 0
fi

PY=""
for p in python3.12 python3.13 python3.11 python3.14 python3; do
  if command -v "$p" >/dev/null 2>&1 &&
    "$p" -c 'import sys, venv, ensurepip; sys.exit(not ((3, 11) <= sys.version_info[:2] <= (3, 14)))' >/dev/null 2>&1; then
    PY=$(command -v "$p")
    break
  fi
done
if [ -z "$PY" ]; then
  echo "vllm-venv: no python 3.11-3.14 with the venv module (vLLM 0.33 needs one; apt-get install python3-venv)" >&2
  exit 1
fi
echo "vllm-venv: building $VENV with $PY ($STAMP)"
rm -rf "$VENV"
"$PY" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip install -q --disable-pip-version-check)
"${PIP[@]}" "torch==$TORCH" pytest
"${PIP[@]}" --no-deps "vllm==$VLLM"
# vLLM's own requirement list, minus extras and its GPU kernel packages.
"$VENV/bin/python" - >"$VENV/.tilert-reqs.txt" <<'PY'
import re
from importlib.metadata import requires
from packaging.requirements import Requirement

gpu_only = re.compile(r"^(torch|torchaudio|torchvision|torchcodec|pynvvideocodec|flashinfer-python|apache-tvm-ffi|"
                      r"tilelang|nvidia-.*|nvtx|fastsafetensors|instanttensor|quack-kernels|tokenspeed-mla|"
                      r"humming-kernels|numba)$")
for line in requires("vllm"):
    r = Requirement(line)
    if r.marker is not None and not r.marker.evaluate({"extra": ""}):
        continue
    if gpu_only.match(r.name.lower().replace("_", "-")):
        continue
    print(line.split(";")[0].strip())
PY
"${PIP[@]}" -r "$VENV/.tilert-reqs.txt"
"$VENV/bin/python" -c 'import vllm, torch, pytest; from vllm.v1.core.sched.scheduler import Scheduler'
echo "$STAMP" >"$VENV/.tilert-stamp"
echo "vllm-venv: ready: $VENV ($(du -sh "$VENV" | cut -f1))"
