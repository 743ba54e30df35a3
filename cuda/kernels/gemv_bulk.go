package kernels

import (
	"sync/atomic"

	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/cuda"
)

// Bulk-copy one-row GEMV (cu/gemv_bulk.cu, gemv_bulk_fp8_g32_r8 /
// gemv_bulk_fp8_g64_r8; the tile plan variant _bk, e.g.
// TILERT_GPU_OPROJ=G64/R8_bk/B0): one block an SM, its weights brought into a
// ring of shared-memory stages by cp.async.bulk (sm_90), its row tiles dealt
// out as _d16s deals them; the sums are the tile kernels' for the plan's G,
// bit for bit.

// BulkVariant is the tile plan variant that pins a shape to the bulk-copy
// GEMV (G32/R8_bk/B0 and G64/R8_bk/B0).
const BulkVariant = "_bk"

// Its shape: 8-row group tiles, stages of 32 KB (8 rows x G 16-byte chunks
// x 256/G groups), bulkStages of them (the kernel's GB_MAX_STAGES bounds it).
const (
	bulkRows       = 8
	bulkStageBytes = 32 << 10
	bulkStages     = 4
	bulkSmem       = 128 + bulkStages*bulkStageBytes // GB_BARS, then the stages
)

// BulkLaunches counts launches of the bulk-copy GEMV (tests).
var BulkLaunches atomic.Int64

func bulkKernel(G int) string {
	if G == 32 {
		return "gemv_bulk_fp8_g32_r8"
	}
	return "gemv_bulk_fp8_g64_r8"
}

// BulkFits says whether a one-row fp8 GEMV of N rows of K can run on the
// bulk-copy GEMV with G threads a group on this device: sm_90+, whole
// 8-row tiles, K a whole number of G-chunk stage columns.
func (k *Set) BulkFits(N, K, G int) bool {
	return k.c.Info().CCMajor >= 9 && bulkShapeOK(N, K, G)
}

func bulkShapeOK(N, K, G int) bool {
	return (G == 32 || G == 64) && N > 0 && N%bulkRows == 0 && K > 0 && K%(16*G) == 0
}

// bulkSetup raises the bulk-copy kernels' dynamic shared memory limit (before
// any graph capture: SetTilePlan runs it when a shape is pinned to _bk).
func (k *Set) bulkSetup() error {
	if k.c.Info().CCMajor < 9 {
		return nil // no bulk launch here (bulkLaunch falls back)
	}
	for _, G := range []int{32, 64} {
		f, err := k.fn(bulkKernel(G))
		if err != nil {
			return err
		}
		if _, set := bigShared.Load(f); !set {
			if err := k.c.SetMaxDynamicShared(f, bulkSmem); err != nil {
				return errors.Wrap(err, "the bulk-copy GEMV's shared memory")
			}
			bigShared.Store(f, true)
		}
	}
	return nil
}

// bulkLaunch runs y = W x (+ resid) for one input row on the bulk-copy
// kernel of G threads a group when the device, shape and pointers allow it,
// and reports whether it did.
func (k *Set) bulkLaunch(s cuda.Stream, y, x, w, scale, resid cuda.DevPtr, N, K, G int) (bool, error) {
	if !k.BulkFits(N, K, G) || scale == 0 || uint64(w)%16 != 0 || uint64(x)%16 != 0 {
		return false, nil
	}
	if k.bulkErr != nil {
		return false, k.bulkErr
	}
	f, err := k.fn(bulkKernel(G))
	if err != nil {
		return false, err
	}
	if _, set := bigShared.Load(f); !set {
		// Not pinned through SetTilePlan (GemvBulk called directly).
		if err := k.bulkSetup(); err != nil {
			return false, err
		}
	}
	BulkLaunches.Add(1)
	grid := min(k.c.Info().SMs, N/bulkRows)
	return true, k.launchFn(f, cuda.D1(grid), cuda.D1(tileThreads), bulkSmem, s, w, scale, x, y, resid, N, K, bulkStages)
}

// GemvBulk is GemvFP8Tile for one input row on the bulk-copy GEMV with G
// (32 or 64) threads a group: the tile kernels' bits for that G. It
// refuses what the kernel cannot take (BulkFits, unaligned pointers,
// missing scales).
func (k *Set) GemvBulk(s cuda.Stream, y, x, w, scale, resid cuda.DevPtr, N, K, G int) error {
	done, err := k.bulkLaunch(s, y, x, w, scale, resid, N, K, G)
	if err == nil && !done {
		return errors.WithHint(errors.Newf("gemv bulk: N=%d K=%d G=%d on sm_%d%d (w %#x, x %#x, scale %#x)", N, K, G,
			k.c.Info().CCMajor, k.c.Info().CCMinor, uint64(w), uint64(x), uint64(scale)),
			"it needs sm_90+, N a multiple of 8, K a multiple of 16 G, 16-byte aligned weights and input, and block scales; run GemvFP8Tile otherwise")
	}
	return err
}
