#!/usr/bin/env bash
# make gpu-check: build the gpu package's test binary (CGO_ENABLED=0) and run
# every GPU check on the NVIDIA GPU of this machine: each kernel against its
# CPU reference on fresh random inputs, the executor, pinned memory, CUDA
# graphs, then kernel timings against a device-to-device copy. Prints the
# table (check, metric, max error, bound, PASS/FAIL; then the timings).
#
#   scripts/gpu-check.sh                # build (if Go is here) and run
#   scripts/gpu-check.sh --build-only   # build .device/gpu/gpu.test, to carry to a GPU machine
#
# Env: OUT (logs and report, default .device/gpu-check), GPU_TEST_BIN,
# TILERT_GPU_SEED (reproduce inputs), TILERT_NVRTC / NVRTC_PATH (libnvrtc),
# GPU_CHECK_RUN (a -test.run pattern, default all).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
bin=${GPU_TEST_BIN:-.device/gpu/gpu.test}
case $bin in /*) ;; *) bin=$root/$bin ;; esac
out=${OUT:-.device/gpu-check}
case $out in /*) ;; *) out=$root/$out ;; esac
mkdir -p "$(dirname "$bin")" "$out"

if command -v go >/dev/null 2>&1 && [ "${GPU_CHECK_NOBUILD:-0}" != 1 ]; then
	echo "== building $bin"
	CGO_ENABLED=0 go vet ./gpu
	CGO_ENABLED=0 go test -c -o "$bin" ./gpu
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
# The tests read their package's files, so run in gpu/ as go test would.
(cd gpu && "$bin" -test.v -test.count=1 -test.timeout=9m -test.run "${GPU_CHECK_RUN:-.}") 2>&1 | tee "$out/gpu-test.log"
rc=${PIPESTATUS[0]}
set -e
pass=$(grep -c -- '^--- PASS' "$out/gpu-test.log" || true)
fail=$(grep -c -- '^--- FAIL' "$out/gpu-test.log" || true)
skip=$(grep -c -- '^--- SKIP' "$out/gpu-test.log" || true)
echo
echo "== gpu-check: tests $pass passed, $fail failed, $skip skipped (exit $rc); full log $out/gpu-test.log"
if [ -f "$TILERT_GPU_REPORT" ]; then
	cat "$TILERT_GPU_REPORT"
fi
if grep -q -- '--- SKIP: TestKernel' "$out/gpu-test.log"; then
	echo "gpu-check: kernel tests were skipped: no usable GPU here" >&2
	[ "$rc" = 0 ] && rc=3
fi
exit "$rc"
