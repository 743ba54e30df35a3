#!/usr/bin/env bash
# make gpu-check: build the kernel package's (cuda/kernels) test binary (CGO_ENABLED=0) and run
# every GPU check on the NVIDIA GPU of this machine: each kernel against its
# CPU reference on fresh random inputs, the executor, pinned memory, CUDA
# graphs, then kernel timings against a device-to-device copy; the CUPTI
# binding of the kernel timeline (a traced graph); then the
# model checks of the GPU engine (engine/gpu) on both tiny presets: greedy
# output == CPU serving with and without MTP (fp8_ds_mla and bf16 MLA
# caches), exact mode (float32 caches) vs the HF goldens with the CPU exact
# criteria (1e-3 rel logit error per step, MTP logits, identical greedy with
# and without MTP), exact-mode import of CPU state, forced-draft MTP verification,
# prefill caches vs the CPU engine's bytes, import of CPU state, logits vs
# the CPU forward, HF golden top-1 when testdata/golden exists; the
# tensor-parallel engine with 1/2/4/8 ranks on this one GPU (greedy ==
# unsharded, exact vs HF goldens, handoff of CPU state) and the timing of
# the TP-8 shard of one real DeepSeek-V3.2 / GLM-5 MoE layer. Prints the
# kernel table (check, metric, max error, bound, PASS/FAIL; then the
# timings) and the model table.
#
#   scripts/gpu-check.sh                # build (if Go is here) and run
#   scripts/gpu-check.sh --build-only   # build .device/gpu/{kernels,engine,decode}.test, to carry to a GPU machine
#
# Env: OUT (logs and report, default .device/gpu-check), GPU_TEST_BIN,
# TILERT_GPU_SEED (reproduce inputs), TILERT_NVRTC / NVRTC_PATH (libnvrtc),
# GPU_CHECK_RUN (a -test.run pattern, default all), ENGINE_CHECK_RUN (the
# engine tests' pattern, default the GPU ones: '^TestGPU'; "skip" skips them),
# ENGINE_TEST_BIN, DECODE_TEST_BIN, CUDA_TEST_BIN, CUPTI_TEST_BIN (the kernel
# timeline's CUPTI binding: skipped, saying so, without libcupti).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
bin=${GPU_TEST_BIN:-.device/gpu/kernels.test}
case $bin in /*) ;; *) bin=$root/$bin ;; esac
ebin=${ENGINE_TEST_BIN:-.device/gpu/engine.test}
case $ebin in /*) ;; *) ebin=$root/$ebin ;; esac
dbin=${DECODE_TEST_BIN:-.device/gpu/decode.test}
case $dbin in /*) ;; *) dbin=$root/$dbin ;; esac
cbin=${CUDA_TEST_BIN:-.device/gpu/cuda.test}
case $cbin in /*) ;; *) cbin=$root/$cbin ;; esac
pbin=${CUPTI_TEST_BIN:-.device/gpu/cupti.test}
case $pbin in /*) ;; *) pbin=$root/$pbin ;; esac
out=${OUT:-.device/gpu-check}
case $out in /*) ;; *) out=$root/$out ;; esac
mkdir -p "$(dirname "$bin")" "$out"

if command -v go >/dev/null 2>&1 && [ "${GPU_CHECK_NOBUILD:-0}" != 1 ]; then
	echo "== building $bin"
	CGO_ENABLED=0 go vet ./cuda ./cuda/kernels
	CGO_ENABLED=0 go test -c -o "$bin" ./cuda/kernels
	CGO_ENABLED=0 go test -c -o "$cbin" ./cuda
	CGO_ENABLED=0 go test -c -o "$pbin" ./cuda/cupti
	CGO_ENABLED=0 go vet ./engine/gpu
	CGO_ENABLED=0 go test -c -o "$ebin" ./engine/gpu
	CGO_ENABLED=0 go test -c -o "$dbin" ./roles/decode
fi
if [ "${1:-}" = "--build-only" ]; then
	exit 0
fi
if [ ! -x "$bin" ]; then
	echo "gpu-check: no test binary at $bin and no Go toolchain to build it" >&2
	exit 2
fi
if command -v nvidia-smi >/dev/null 2>&1; then
	nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem,temperature.gpu --format=csv |
		tee "$out/nvidia-smi.txt" || true
fi

export TILERT_GPU_TIMING=${TILERT_GPU_TIMING:-1}
export TILERT_GPU_REPORT=$out/report.txt
export TILERT_KERNEL_CACHE=${TILERT_KERNEL_CACHE:-${TMPDIR:-/tmp}/tilert-kernels}
rm -f "$TILERT_GPU_REPORT"
set +e
# The binding's own device tests first (a few seconds): zero-copy gathers,
# the device thread surviving a t.Skip/t.Fatal inside Do.
crc=0
if [ -x "$cbin" ]; then
	(cd cuda && "$cbin" -test.v -test.count=1 -test.timeout=2m) > "$out/cuda-test.log" 2>&1
	crc=$?
fi
# The kernel timeline's CUPTI binding (a graph of three kernels traced twice).
prc=0
if [ -x "$pbin" ]; then
	(cd cuda/cupti && "$pbin" -test.v -test.count=1 -test.timeout=2m -test.run '^(TestGPUTraceGraph|TestLibrary)$') > "$out/cupti-test.log" 2>&1
	prc=$?
fi
# The tests read their package's files, so run in cuda/kernels/ as go test would.
(cd cuda/kernels && "$bin" -test.v -test.count=1 -test.timeout=9m -test.run "${GPU_CHECK_RUN:-.}") 2>&1 | tee "$out/gpu-test.log"
rc=${PIPESTATUS[0]}
set -e
erc=0
erun=${ENGINE_CHECK_RUN:-^TestGPU}
if [ "$erun" != skip ]; then
	if [ ! -x "$ebin" ]; then
		echo "gpu-check: no engine test binary at $ebin" >&2
		erc=2
	else
		export TILERT_ENGINE_REPORT=$out/engine-report.txt
		export TILERT_SHARD_REPORT=$out/shard-timing.txt
		rm -f "$TILERT_ENGINE_REPORT" "$TILERT_SHARD_REPORT"
		set +e
		(cd engine/gpu && "$ebin" -test.v -test.count=1 -test.timeout=9m -test.run "$erun") 2>&1 | tee "$out/engine-test.log"
		erc=${PIPESTATUS[0]}
		set -e
	fi
fi
# The decode node on the GPU backend: state handed over the ctrl port and
# the tcp engine (NIXL where its library is found), streamed ids equal to
# the sending GPU engine's own generation, with and without MTP, N=1 and 4,
# and states whose MTP cache stops one short of seq_len (admit mtp_len).
drc=0
drun=${DECODE_CHECK_RUN:-'TestHandoff(EqualsLocalGeneration|MTPLen)/cuda'}
if [ "$drun" != skip ] && [ -x "$dbin" ]; then
	set +e
	(cd roles/decode && "$dbin" -test.v -test.count=1 -test.timeout=9m -test.run "$drun") 2>&1 | tee "$out/decode-test.log"
	drc=${PIPESTATUS[0]}
	set -e
fi
count() { grep -c -- "$1" "$2" 2>/dev/null || true; }
echo
if [ -f "$out/cuda-test.log" ]; then
	echo "== gpu-check: cuda binding tests $(count '^--- PASS' "$out/cuda-test.log") passed, $(count '^--- FAIL' "$out/cuda-test.log") failed, $(count '^--- SKIP' "$out/cuda-test.log") skipped (exit $crc); full log $out/cuda-test.log"
fi
if [ -f "$out/cupti-test.log" ]; then
	echo "== gpu-check: CUPTI binding tests $(count '^--- PASS' "$out/cupti-test.log") passed, $(count '^--- FAIL' "$out/cupti-test.log") failed, $(count '^--- SKIP' "$out/cupti-test.log") skipped (exit $prc); full log $out/cupti-test.log"
fi
echo "== gpu-check: kernel tests $(count '^--- PASS' "$out/gpu-test.log") passed, $(count '^--- FAIL' "$out/gpu-test.log") failed, $(count '^--- SKIP' "$out/gpu-test.log") skipped (exit $rc); full log $out/gpu-test.log"
if [ -f "$out/engine-test.log" ]; then
	echo "== gpu-check: engine tests $(count '^--- PASS' "$out/engine-test.log") passed, $(count '^--- FAIL' "$out/engine-test.log") failed, $(count '^--- SKIP' "$out/engine-test.log") skipped (exit $erc); full log $out/engine-test.log"
fi
if [ -f "$out/decode-test.log" ]; then
	echo "== gpu-check: decode-node handoff on the GPU backend: $(count '--- PASS' "$out/decode-test.log") passed, $(count '--- FAIL' "$out/decode-test.log") failed, $(count '--- SKIP' "$out/decode-test.log") skipped (exit $drc)"
	grep -E -- '--- (PASS|FAIL|SKIP): TestHandoff' "$out/decode-test.log" | sed 's/^ */  /'
fi
if [ -f "$TILERT_GPU_REPORT" ]; then
	cat "$TILERT_GPU_REPORT"
fi
if [ -f "${TILERT_ENGINE_REPORT:-/nonexistent}" ]; then
	echo
	cat "$TILERT_ENGINE_REPORT"
fi
if [ -f "${TILERT_SHARD_REPORT:-/nonexistent}" ]; then
	echo
	echo "== TP-8 shard of one real MoE layer (engine/gpu TestGPUShardLayerTiming)"
	cat "$TILERT_SHARD_REPORT"
fi
if grep -q -- 'no GPU here' "$out/gpu-test.log"; then
	echo "gpu-check: kernel tests were skipped: no usable GPU here" >&2
	[ "$rc" = 0 ] && rc=3
fi
[ "$rc" = 0 ] && rc=$crc
[ "$rc" = 0 ] && rc=$prc
[ "$rc" = 0 ] && rc=$erc
[ "$rc" = 0 ] && rc=$drc
exit "$rc"
