package kernels

import (
	"os"
	"sync/atomic"

	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/cuda"
)

// TILERT_GPU_SOLO (issue 10; opt-in, NOT RUN): the one-row step's
// one-block kernels on its critical path (the top-k of a row, the norms,
// the routing; a few-block epilogue) run latency chains of shared-memory
// passes, barriers and L2 round trips, and the block scheduler puts them
// on SMs that also hold blocks of the weight streams beside them (q_b and
// absorb_q beside the top-k, the router beside the routing), whose warps
// take issue slots, the load/store pipes and L1 bandwidth. A solo launch
// asks for all the shared memory a block may have (MaxSharedOptin, as
// dynamic memory the kernel never touches), so with the driver's per-block
// reserve no other block fits on its SM: the kernel runs alone there. Its
// code, grid and outputs are unchanged. What it costs: a parked early
// (programmatic) solo block holds a whole SM, and it can start only on an
// SM with no block left, which may come later than a free slot would.
//
// Values: unset or 0 none; 1 soloDefault; else a comma-separated list of
// prefixes of soloKernels' names.
var soloSel, soloSelErr = parseSolo(os.Getenv("TILERT_GPU_SOLO"))

// soloKernels are the kernels TILERT_GPU_SOLO may name: grids of at most a
// few blocks, no dynamic shared memory of their own.
var soloKernels = setOf(
	"topk_radix_one_w8", "topk_radix_one_w12", "topk_radix_one_w16", "topk_radix_one_w32",
	"topk_fast16", "topk_fast32", "topk_fast64", // the few module's one-block top-k
	"add_rmsnorm_reg", "rmsnorm_reg", "moe_route_rank", "attn_epilogue",
)

// soloDefault is TILERT_GPU_SOLO=1: the one-block kernels of every one-row
// layer's critical path.
const soloDefault = "topk_radix_one,topk_fast,add_rmsnorm_reg,rmsnorm_reg,moe_route_rank"

// soloLaunches counts the launches made solo (tests).
var soloLaunches atomic.Int64

// SoloLaunches is how many launches TILERT_GPU_SOLO made solo in this
// process.
func SoloLaunches() int64 { return soloLaunches.Load() }

// soloMaxBlocks: a launch of more blocks than this runs as it would
// without the switch (solo blocks each take an SM).
const soloMaxBlocks = 8

func parseSolo(v string) ([]string, error) {
	switch v {
	case "", "0":
		return nil, nil
	case "1":
		v = soloDefault
	}
	return namePrefixes("TILERT_GPU_SOLO", v, soloKernels,
		"1 for "+soloDefault+", or prefixes of the kernels cuda/kernels/solo.go lists (soloKernels), separated by commas")
}

// soloShared is the dynamic shared memory that leaves a block alone on
// its SM: all a block may opt into, less the staticShared bytes its kernel
// declares; 0 where that would not keep another block out (the device
// does not say, or another block's reserve would still fit beside it).
func soloShared(info cuda.DeviceInfo, staticShared int) int {
	dyn := info.MaxSharedOptin - staticShared
	if info.MaxSharedPerSM <= 0 || dyn <= 0 || info.MaxSharedOptin+2*info.ReservedShared <= info.MaxSharedPerSM {
		return 0
	}
	return dyn
}

// soloFor is the dynamic shared memory a launch of f over blocks blocks
// with smem bytes of its own gets: soloShared for a named kernel, else
// smem. The first solo launch of f raises its limit.
func (k *Set) soloFor(f *cuda.Function, blocks, smem int) (int, error) {
	if len(soloSel) == 0 || smem != 0 || blocks > soloMaxBlocks || !soloKernels[f.Name] || !hasPrefixIn(f.Name, soloSel) {
		return smem, nil
	}
	dyn := soloShared(k.c.Info(), f.StaticShared)
	if dyn == 0 {
		return smem, nil
	}
	if k.soloSet == nil {
		k.soloSet = map[*cuda.Function]bool{}
	}
	if !k.soloSet[f] {
		if err := k.c.SetMaxDynamicShared(f, dyn); err != nil {
			return 0, errors.Wrapf(err, "TILERT_GPU_SOLO: %s", f.Name)
		}
		k.soloSet[f] = true
	}
	soloLaunches.Add(1)
	return dyn, nil
}
