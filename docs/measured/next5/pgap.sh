# Fragment of helper pgap (branch pgap), issue 10: where an 8192-token prefill's wall time goes beyond its device
# time (s8 runs, docs/measured/h200-2026-12-02-s8: 145.45 ms wall against 130.5 ms of calls timed alone with TILERT_GPU_GEMM_SPLITS=1
# TILERT_GPU_MLA_PREFILL=5; 450.04 against 430.1 ms with the defaults). Found: the grouped MoE's host step
# (engine/gpu/gemm.go moeGrouped) sorted the 65536 (row, expert) pairs of the chunk with slices.SortStableFunc,
# 13-19 ms of host time with the device idle behind the ids download. Now a counting sort (0.25 ms) and the
# shared expert queued right after the download, so the device runs it (~3 ms of GEMMs) while the host orders
# the pairs; same launches on the same inputs, same bits (emulator hashes equal to main's).
# Needs $D (kernels.test, engine.test, decode.test, tilert built from the branch) and $R (results dir); run from the
# repo root. Whole fragment <= 90 s: each step's timeout is the smaller of its own cap and what is left of 90 s.
# A cold NVRTC cache costs the first bench ~50 s (the main module; hence its 60 s cap, a warm bench takes < 25 s as
# in pwg's step 2): best run after a fragment that compiled it; TILERT_KERNEL_CACHE is shared with the others.
export TILERT_KERNEL_CACHE=${TILERT_KERNEL_CACHE:-/tmp/tilert-kernels}
pg_t0=$SECONDS
pg_left() { local l=$((90 - (SECONDS - pg_t0))); [ $l -lt 1 ] && l=1; [ $l -lt $1 ] && echo $l || echo $1; }
mkdir -p $R/pgap
# 1. the prefill bench with the new line per --prefill-lens length (gpu.Engine.ClockPrefill): wall time, device busy
#    time (events cut at every host wait), device span, and their differences. First the opt-in one-part + wgmma
#    switches (issue 10's candidate), then the defaults. Expect: "device idle at host waits" < 1 ms (was ~15 ms of
#    the gap), "host outside the span" < 0.5 ms; busy close to the profile's sum of calls alone (130.5 / 430.1 ms);
#    prefill 8192 wall ~131-133 ms with the switches (was 145.45), ~431-433 ms with the defaults (was 450.04);
#    prefill 1024 ~1.5-2 ms faster than before (17.80 / 53.60 ms).
i=0
for e in "TILERT_GPU_GEMM_SPLITS=1 TILERT_GPU_MLA_PREFILL=5" ""; do
  i=$((i+1)); echo "$e" > $R/pgap/prefill-$i.env
  cap=25; [ $i = 1 ] && cap=60
  env $e timeout $(pg_left $cap) $D/tilert bench decode --device cuda --dummy-weights deepseek-v3.2 --layers 1 --prompt-len 8192 \
    --tokens 4 --prefill-lens 1024,8192 --profile --json $R/pgap/prefill-$i.json > $R/pgap/prefill-$i.txt 2>&1
  echo rc=$? >> $R/pgap/prefill-$i.txt
done
# 2. engine checks on the GPU: ClockPrefill leaves Prefill's first token and cache bytes and its times are ordered
#    (0 < busy <= span <= wall, >= 3 segments); the GEMM prefill (grouped MoE, shared expert now beside the host's
#    ordering) still equals the CPU's cache bytes and greedy tokens.
(cd engine/gpu && TILERT_ENGINE_REPORT=$R/pgap/engine-report.txt timeout $(pg_left 25) $D/engine.test -test.count=1 -test.v \
  -test.run 'TestGPUClockPrefill$|TestGPUPrefillGemmCaches$|TestGPUPrefillGemmGreedy$' > $R/pgap/engine.log 2>&1; echo rc=$? >> $R/pgap/engine.log)
