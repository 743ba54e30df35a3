package kernels

import (
	"fmt"
	"strings"

	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/cuda"
)

// Tile GEMVs (gemv_tile.cu): up to MaxTileM input rows per launch with x
// reused from registers across the rows a thread streams, split-K inside a
// block sized by K, gate/up/SwiGLU paired in one launch, and the routed
// experts of several rows plus the shared expert as slots of one launch.

// MaxTileM is the most input rows one tile GEMV takes.
const MaxTileM = 8

const tileThreads = 256

// forceTileG and forceTileR pin the group size and rows per group, and
// forceTileV the variant ("-" for the plain one; tests and timing sweeps);
// 0 and "" let tileShape and tileVariant choose.
var (
	forceTileG, forceTileR, forceTileB int
	forceTileV                         string
)

// tileGridX is the blocks per slot: one per row tile, or (B > 0 blocks per
// SM over all nslots slots; B < 0: -B blocks per slot, for tests) fewer
// blocks that take several tiles in turn.
func tileGridX(tiles, B, sms, nslots int) int {
	switch {
	case B < 0:
		return min(tiles, -B)
	case B == 0:
		return tiles
	}
	return min(tiles, max(1, cdiv(B*max(1, sms), nslots)))
}

// tileCap is the blocks per SM budget for the launch (0: a block per tile):
// a test's forceTileB, else SetTileCap's.
func (k *Set) tileCap() int {
	if forceTileB != 0 {
		return forceTileB
	}
	return k.tileB
}

// SetTileCap caps the grids of later tile GEMV launches at b blocks per SM
// (0: a block per row tile, the default) and returns the previous cap. The
// blocks then take several row tiles in turn, each thread summing its
// chunks in the same order, so the outputs keep their bits. A capped
// weight stream leaves SM room to a latency-bound chain on another stream
// (engine/gpu side.go).
func (k *Set) SetTileCap(b int) (prev int) {
	prev, k.tileB = k.tileB, max(0, b)
	return prev
}

// TileCap is SetTileCap's current cap.
func (k *Set) TileCap() int { return k.tileB }

// Tile variants of one input row of fp8 weights, each with the plain
// kernel's per-thread chunk order (so the same sums bit for bit): "_d16"
// keeps 16 loads in flight per thread (two rounds' worth, 128 registers,
// two blocks per SM), "_o4" 8 loads at 64 registers (four blocks per SM).
var tileVariants = []string{"", "_d16", "_o4"}

// tileVariant is the kernel name suffix for groups of G threads and R rows
// streaming kbytes-byte rows, M input rows of fp8 (esize 1) or bf16
// weights.
func tileVariant(G, R, kbytes, M, esize int) string {
	if esize != 1 || tileMM(M) != 1 {
		return ""
	}
	v := ""
	if TileRule == 3 {
		v = tileVariant3(G, R, kbytes/16)
	}
	switch f := forceTileV; {
	case f == "-":
		v = ""
	case f != "":
		v = f
	}
	if (v == "_d16" && R < 2) || (v == "_o4" && R < 4) {
		return ""
	}
	return v
}

// tileVariant3 is rule 3's variant for C 16-byte chunks per row: the H200
// sweep (docs/measured/h200-2026-12-01-experts run 2) streamed short rows
// that every thread of a group covers alike in at most two chunks (or less
// than one), such as the experts' down projection, best with four blocks
// per SM ("_o4": 41.3 against 44.5 us for 9 x 7168x2048, TP-8 shard down
// 12.1 against 14.8 us), and everything else with 16 loads in flight
// ("_d16": 36.0 against 48.2 us plain for o_proj, 74.5 against 78.1 for
// the 9 gate-up slots, 16.7 against 17.8 for q_b, where a 1536-byte row
// leaves half a group's threads one chunk short).
func tileVariant3(G, R, C int) string {
	switch {
	case R >= 4 && (C < G || (C <= 2*G && C%G == 0)):
		return "_o4"
	case R >= 2:
		return "_d16"
	}
	return ""
}

// tileLaunchShape is a tile launch's group size, rows per group and variant
// (before a pinned plan) for N rows of kbytes bytes, M input rows of esize
// weights, shaped as shapeAs slots; routed: the launch runs routed expert
// slots and no dense (shared expert) slot, ex what oneRowExperts reads of it.
func tileLaunchShape(sms, N, kbytes, M, esize, shapeAs int, pair, routed bool, ex expertLaunch) (G, R int, v string) {
	G, R = tileShape(sms, N, kbytes, M, shapeAs, pair)
	if M == 1 && esize == 1 && !routed && !pair && shapeAs <= 1 {
		G = wholeChunks(G, kbytes/16)
	}
	v = tileVariant(G, R, kbytes, M, esize)
	if M == 1 && esize == 1 && routed {
		G, v = oneRowExperts(sms, N, G, R, v, pair, shapeAs, ex)
	}
	return G, R, v
}

// OneRowWholeChunks: a single input row's dense fp8 tile launch whose
// 64-thread groups would leave half their threads a 16-byte chunk short
// (rows of 64 < C < 128 chunks, C a multiple of 32: DeepSeek-V3.2 dims'
// 1536-byte rows of q_b and the indexer's wq_b, 1.5 chunks a thread) takes
// groups of 32, every thread then streaming whole chunks (3 at 1536 bytes).
// Session 49 (docs/measured/h100-2026-12-06-s49 calls B-C, one H100, 9 MoE
// layers, evict-first loads, A/B/A/B): q_b alone -18 / -16 us a step at
// 8192, wq_b alone -21 / -19, both -24 / -27 at 8192 and -21 / -17 at
// 131072; 4 slots (other launches) -3 / +6. Session 38's single rows on an
// H100 under normal loads had q_b on G32 no faster, and no H200 has run it
// (TILERT_GPU_WHOLE_CHUNKS=0 goes back to the rule's 64).
var OneRowWholeChunks = true

// wholeChunks is OneRowWholeChunks' group size for a launch the rule puts
// on groups of G threads over rows of C chunks; pinned test shapes
// (forceTileG) win.
func wholeChunks(G, C int) int {
	if OneRowWholeChunks && forceTileG == 0 && G == 64 && C > 64 && C < 128 && C%32 == 0 {
		return 32
	}
	return G
}

// expertLaunch is what oneRowExperts reads of a routed launch beyond its
// shape: the slots it runs (shapeAs may count a shared expert's slot that
// runs in another launch) and whether its paired gate/up goes on _o4
// (ExpertPair, by card).
type expertLaunch struct {
	slots  int
	pairO4 bool
}

// OneRowExperts: a MoE layer's routed-expert launches of one input row (at
// most 9 slots shaped together, no shared expert slot in the launch) take
// their own shapes (oneRowExperts): session 30 streamed their gate/up on
// `_o4` and their down with groups of 32 threads; session 48 keeps those
// where they measured faster (ExpertPair, ExpertDownG32). Measured on the H200 with the routed launches pinned
// (session 30 calls E-F and H, docs/measured/h200-2026-12-04-s30):
// DeepSeek-V3.2 dims 1 slot 2.600 / 2.599 against 2.625 / 2.622 ms at 8192
// (call H: 2.606 / 2.606 against 2.629 / 2.627), 2.756 / 2.754 against
// 2.775 / 2.777 at 131072; GLM-5 dims the same (2.679 / 2.684 against 2.683
// / 2.683); at 2 slots (16 slots a launch) +44 us and at 4 +57, so only a
// single row's. The shared expert's launch (beside them on the side stream,
// capped) keeps the rule's shapes: with it on these shapes too (call G) the
// gain was gone (2.620 / 2.625 against 2.628 / 2.624). So the launch of
// routed and shared slots together (side streams off) keeps the rule's
// shapes, and the split launches sum the routed down in another order than
// it (G 32 against 64: the same floats up to float32 rounding). The engine
// turns it off with TILERT_GPU_EXPERT_SHAPE=0.
var OneRowExperts = true

// ExpertPair picks a single row's routed gate/up variant (OneRowExperts):
// "" by card, "o4" or "d16" on every card. By card: `_o4` (four blocks an
// SM, 8 loads in flight a thread) on an H200, where session 30's sweep had
// it fastest (DeepSeek-V3.2 dims, 8192: 2.622 ms against 2.638-2.686 for
// the other plans, loads at normal L2 priority); the rule's `_d16` (two
// blocks an SM, 16 loads in flight) elsewhere: on an H100 with evict-first
// loads (session 48, docs/measured/h100-2026-12-06-s48, A/B/A/B at 9 MoE
// layers, 1 slot) -12 / -12 us a step at 8192 and -16 / -13 at 131072 for
// DeepSeek-V3.2 dims, about -10 for GLM-5 dims. Not yet measured on an
// H200 with evict-first loads (TILERT_GPU_EXPERT_SHAPE=d16 there).
var ExpertPair = ""

// ExpertDownG32: a single row's routed down on groups of 32 threads always
// (session 30's shape; TILERT_GPU_EXPERT_SHAPE=30). Unset, groups of 32
// only where that launch's last wave of blocks is at least as full as with
// the rule's 64 (downLastWave): the down streams short rows (2048 bytes)
// from every resident block, so a half-empty last wave leaves HBM idle at
// the launch's end. DeepSeek-V3.2 dims (7168 rows, 8 slots, 132 SMs at
// four blocks): 32 fills 70% of its last wave against 39%, and measured
// faster on an H200 (session 30) and an H100 (session 48: 3.255 against
// 3.270 ms); GLM-5 dims (6144 rows): 45% against 91%, and 64 measured
// faster on an H100 (session 48: -13 / -11 us at 8192, -13 / -14 at
// 131072, A/B/A/B; within noise on an H200 in session 30's pins).
var ExpertDownG32 = false

// oneRowExperts is OneRowExperts' shape for a launch of a single row's
// routed experts of N rows shaped as shapeAs slots: the paired gate/up on
// `_o4` where ex says so, the down's short rows (`_o4` at G = 64) on groups
// of 32 where ExpertDownG32 or their last wave says so. Pinned test shapes
// (forceTileG, forceTileV) win.
func oneRowExperts(sms, N, G, R int, v string, pair bool, shapeAs int, ex expertLaunch) (int, string) {
	if !OneRowExperts || shapeAs < 2 || shapeAs > 9 || forceTileG != 0 || forceTileV != "" || R < 4 {
		return G, v
	}
	switch {
	case pair && v == "_d16" && ex.pairO4:
		return G, "_o4"
	case !pair && v == "_o4" && G == 64 && (ExpertDownG32 || downLastWave(sms, N, R, 32, ex.slots) >= downLastWave(sms, N, R, 64, ex.slots)):
		return 32, "_o4"
	}
	return G, v
}

// downLastWave is how full (0, 1] the last wave of an `_o4` down launch of
// N rows on groups of G threads, R rows a group, is over slots slots, at
// the four blocks an SM `_o4` keeps resident.
func downLastWave(sms, N, R, G, slots int) float64 {
	blocks := tileBlocks(N, G, R, slots, false)
	wave := 4 * max(1, sms)
	if r := blocks % wave; r != 0 {
		return float64(r) / float64(wave)
	}
	return 1
}

// ExpertShapes says what a single row's routed-expert launches take on
// this card (OneRowExperts, ExpertPair, ExpertDownG32), for the log.
func (k *Set) ExpertShapes() (pair, down string) { return expertShapes(k.c.Info().Name) }

func expertShapes(card string) (pair, down string) {
	if !OneRowExperts {
		return "the tile rule's", "the tile rule's"
	}
	pair, down = "_d16", "groups of 32 where their last wave is fuller"
	if expertPairO4(card) {
		pair = "_o4"
	}
	if ExpertDownG32 {
		down = "groups of 32"
	}
	return pair, down
}

// expertPairO4 is ExpertPair's choice on a card named name.
func expertPairO4(name string) bool {
	switch ExpertPair {
	case "o4":
		return true
	case "d16":
		return false
	}
	return strings.Contains(name, "H200")
}

// tileMM is the compiled row bound for M rows.
func tileMM(M int) int {
	for _, mm := range []int{1, 2, 4, 8} {
		if M <= mm {
			return mm
		}
	}
	return 8
}

// TileRule picks the tile kernels' shape rule and arithmetic: 1 is what
// gpu-check passed with first on the H200 (docs/measured/
// h200-2026-12-01-gemv2 run 1); 2 streams faster (run 2: step 5.15 -> 4.57
// ms) with another group size (summation order) and, for several input
// rows, each weight scaled before its products (the CPU's order); 3 is
// rule 2's group sizes and arithmetic, so the same floats bit for bit, with
// the rows per group and loads in flight of the experts sweep
// (docs/measured/h200-2026-12-01-experts); it is the default.
var TileRule = 3

// tileShape picks the group size G (threads splitting K) and the rows per
// group R for N output rows of kbytes bytes, M input rows and nslots slots
// in y, by TileRule.
func tileShape(sms, N, kbytes, M, nslots int, pair bool) (G, R int) {
	if TileRule >= 2 {
		G, R = tileShape2(sms, N, kbytes, M, nslots, pair)
	} else {
		G, R = tileShape1(sms, N, kbytes, M, nslots, pair)
	}
	if f := forceTileG; f == 32 || f == 64 || f == 128 || f == 256 {
		G = f
	}
	if f := forceTileR; (f == 1 && !pair) || ((f == 2 || f == 4 || f == 8) && f*tileMM(M) <= 32) {
		R = f
	}
	return G, R
}

func tileBlocks(N, G, R, nslots int, pair bool) int {
	rout := R
	if pair {
		rout = R / 2
	}
	return cdiv(cdiv(N, rout), tileThreads/G) * nslots
}

// tileShape1: G so that every thread streams at least two 16-byte chunks
// per row where K allows; R (x reuse) from 8 down while a row's chunks per
// thread exceed the 8/R loads of a round (not below 2), at most 16/M,
// halved while the grid would not give every SM two blocks.
func tileShape1(sms, N, kbytes, M, nslots int, pair bool) (G, R int) {
	C := kbytes / 16
	G = tileThreads
	for G > 32 && C < 2*G {
		G /= 2
	}
	cpt := cdiv(C, G)
	R = 8
	for R > 2 && 8/R < cpt {
		R /= 2
	}
	R = min(R, 16/tileMM(M))
	minR := 1
	if pair {
		minR = 2
	}
	for R > minR && tileBlocks(N, G, R, nslots, pair) < 2*max(1, sms) {
		R /= 2
	}
	return G, R
}

// tileShape2: the H200 sweep (run 1's log) streamed best with 8 rows per
// group and 64 threads per group on every decode shape whose grid had a
// block per SM; smaller grids take wider groups (while K gives each thread
// a chunk), then fewer rows down to half a block per SM. M rows cap R by
// registers (R*M <= 32).
func tileShape2(sms, N, kbytes, M, nslots int, pair bool) (G, R int) {
	C := kbytes / 16
	G = 64
	if C < 64 {
		G = 32
	}
	R = min(8, 32/tileMM(M))
	minR := 1
	if pair {
		minR = 2
	}
	for tileBlocks(N, G, R, nslots, pair) < max(1, sms) && G < tileThreads && C >= 2*G {
		G *= 2
	}
	for tileBlocks(N, G, R, nslots, pair) < max(1, sms/2) && R > minR {
		R /= 2
	}
	return G, R
}

// TileOK says whether the tile kernels take the shape: whole 16-byte chunks
// of K (weights of esize bytes), float4-aligned x rows.
func TileOK(x cuda.DevPtr, K, ldx, esize int) bool {
	return (K*esize)%16 == 0 && ldx%4 == 0 && uint64(x)%16 == 0
}

// tileLaunch is the one launch behind every tile entry point.
type tileLaunch struct {
	bf16             bool
	t0, ts0, t1, ts1 cuda.DevPtr // expert tables (0: none)
	ids              cuda.DevPtr
	slots            int // routed slots
	w0, s0, w1, s1   cuda.DevPtr
	dense            int // dense slots after the routed ones
	x                cuda.DevPtr
	ldx, xdiv, xsh   int
	y                cuda.DevPtr
	ldy              int
	resid            cuda.DevPtr
	N, K, M          int
	// shapeSlots, when set, picks the launch's shape (G, R) as for that
	// many slots: a launch that runs part of another's slots then gives
	// them that launch's bits (ExpertsFP8Shaped).
	shapeSlots int
}

func (k *Set) tile(s cuda.Stream, a tileLaunch) error {
	name, G, gx := k.tileKernel(a)
	grid := cuda.D3(gx, a.slots+a.dense, 1)
	return k.launch(name, grid, cuda.D1(tileThreads), 0, s, a.t0, a.ts0, a.t1, a.ts1, a.ids, a.slots,
		a.w0, a.s0, a.w1, a.s1, a.x, a.ldx, max(1, a.xdiv), a.xsh, a.y, a.ldy, a.resid, a.N, a.K, a.M, G, b2i(TileRule >= 2))
}

// tileKernel is a's kernel, group size and blocks a slot: the shape rule,
// a pinned plan (TILERT_GPU_TILE_PLANS) and the grid cap.
func (k *Set) tileKernel(a tileLaunch) (name string, G, gx int) {
	esize, wt := 1, "fp8"
	if a.bf16 {
		esize, wt = 2, "bf16"
	}
	pair := a.w1 != 0 || a.t1 != 0
	nslots := a.slots + a.dense
	shapeAs := nslots
	if a.shapeSlots > 0 {
		shapeAs = a.shapeSlots
	}
	sms := k.c.Info().SMs
	routed := a.slots > 0 && a.dense == 0
	var ex expertLaunch
	if routed {
		ex = expertLaunch{slots: nslots, pairO4: expertPairO4(k.c.Info().Name)}
	}
	G, R, v := tileLaunchShape(sms, a.N, a.K*esize, a.M, esize, shapeAs, pair, routed, ex)
	capB := k.tileCap()
	p, pinned := k.tilePlan(a, pair)
	if pinned && p.V == StageVariant {
		pinned = false // the staged kernel's pin, where it did not fit (GemvFP8Tile)
	}
	if pinned {
		G, R, v = p.G, p.R, p.V
		if p.B != 0 {
			capB = p.B
		}
	}
	rout := R
	if pair {
		rout = R / 2
	}
	gx = tileGridX(cdiv(cdiv(a.N, rout), tileThreads/G), capB, sms, nslots)
	if pinned && a.slots == 0 {
		// One dense slot, not paired (a routed launch's pin, PlanExperts /
		// PlanPair, keeps the grid rule over its slots above).
		gx = tilePlanGrid(p, a.N, sms, capB)
	}
	return fmt.Sprintf("gemv_tile_%s_r%d_m%d%s", wt, R, tileMM(a.M), v), G, gx
}

func checkTile(N, K, M, ldx, ldy int) error {
	if N <= 0 || K <= 0 || M <= 0 || M > MaxTileM {
		return errors.Newf("gemv tile: N=%d K=%d M=%d (M must be 1..%d)", N, K, M, MaxTileM)
	}
	if ldx < K || (M > 1 && ldy < N) {
		return errors.Newf("gemv tile: ldx=%d < K=%d or ldy=%d < N=%d", ldx, K, ldy, N)
	}
	return nil
}

// GemvFP8Tile is GemvFP8 for up to MaxTileM rows in one launch (same result
// up to float32 summation order, reproducible run to run). Shapes the tile
// kernels cannot take (K % 16 != 0, unaligned x or w) run GemvFP8 in
// chunks of 4 rows.
func (k *Set) GemvFP8Tile(s cuda.Stream, y, x, w, scale, resid cuda.DevPtr, N, K, M, ldx, ldy int) error {
	if err := checkTile(N, K, M, ldx, ldy); err != nil {
		return err
	}
	if !TileOK(x, K, ldx, 1) || uint64(w)%16 != 0 {
		return k.gemvChunks(func(yy, xx, rr cuda.DevPtr, m int) error {
			return k.GemvFP8(s, yy, xx, w, scale, rr, N, K, m, ldx, ldy)
		}, y, x, resid, M, ldx, ldy)
	}
	a := tileLaunch{w0: w, s0: scale, dense: 1, x: x, ldx: ldx, y: y, ldy: ldy, resid: resid, N: N, K: K, M: M}
	if p, ok := k.tilePlan(a, false); ok && p.V == StageVariant {
		// Pinned to the staged GEMV; a shape or pointer it cannot take
		// runs on the rule's tile kernel (tileKernel ignores the pin).
		if done, err := k.stageLaunch(s, y, x, w, scale, resid, N, K); done || err != nil {
			return err
		}
	}
	return k.tile(s, a)
}

// GemvBF16TileMinM is the fewest input rows GemvBF16Tile takes: the bf16
// tile kernels are compiled for 5..8 rows only (gemv_tile_bf16_r*_m8). The
// engine runs bf16 GEMVs of up to 4 rows on the wide kernels or the tensor
// cores, which measured faster there; the bf16 variants for 1, 2 and 4
// rows were never launched and were removed in session 54
// (cuda/kernels/NOTES.md "Unreachable kernels removed").
const GemvBF16TileMinM = 5

// GemvBF16Tile is GemvFP8Tile for bf16 weights without scales, for
// GemvBF16TileMinM..MaxTileM input rows.
func (k *Set) GemvBF16Tile(s cuda.Stream, y, x, w, resid cuda.DevPtr, N, K, M, ldx, ldy int) error {
	if err := checkTile(N, K, M, ldx, ldy); err != nil {
		return err
	}
	if M < GemvBF16TileMinM {
		return errors.WithHintf(errors.Newf("gemv tile bf16: M=%d input rows; the bf16 tile kernels take %d..%d", M, GemvBF16TileMinM, MaxTileM),
			"run GemvBF16Wide, GemvBF16 or GemvBF16MMA for up to %d rows (as the engine does)", GemvBF16TileMinM-1)
	}
	if !TileOK(x, K, ldx, 2) || uint64(w)%16 != 0 {
		return k.gemvChunks(func(yy, xx, rr cuda.DevPtr, m int) error {
			return k.GemvBF16(s, yy, xx, w, rr, N, K, m, ldx, ldy)
		}, y, x, resid, M, ldx, ldy)
	}
	return k.tile(s, tileLaunch{bf16: true, w0: w, dense: 1, x: x, ldx: ldx, y: y, ldy: ldy, resid: resid, N: N, K: K, M: M})
}

// gemvChunks runs a GEMV of at most 4 rows over M rows.
func (k *Set) gemvChunks(f func(y, x, resid cuda.DevPtr, m int) error, y, x, resid cuda.DevPtr, M, ldx, ldy int) error {
	for r := 0; r < M; r += maxGemvM {
		rr := cuda.DevPtr(0)
		if resid != 0 {
			rr = resid.Add(int64(4 * r * ldy))
		}
		if err := f(y.Add(int64(4*r*ldy)), x.Add(int64(4*r*ldx)), rr, min(maxGemvM, M-r)); err != nil {
			return err
		}
	}
	return nil
}

// GateUpFP8 writes y[m][n] = silu(G x_m)[n] * (U x_m)[n] for M <= MaxTileM
// rows: both fp8 [N][K] projections and the SwiGLU in one launch. Needs the
// tile shape (TileOK, 16-byte aligned weights).
func (k *Set) GateUpFP8(s cuda.Stream, y, x, wg, sg, wu, su cuda.DevPtr, N, K, M, ldx, ldy int) error {
	if err := checkTile(N, K, M, ldx, ldy); err != nil {
		return err
	}
	if !TileOK(x, K, ldx, 1) || uint64(wg)%16 != 0 || uint64(wu)%16 != 0 || wu == 0 {
		return errors.Newf("gate-up: K=%d ldx=%d x=%#x: needs K %% 16 == 0, ldx %% 4 == 0 and aligned x, w", K, ldx, uint64(x))
	}
	return k.tile(s, tileLaunch{w0: wg, s0: sg, w1: wu, s1: su, dense: 1, x: x, ldx: ldx, y: y, ldy: ldy, N: N, K: K, M: M})
}

// ExpertsFP8 is one launch over every expert slot of a MoE projection:
// slot j < slots multiplies expert ids[j]'s fp8 [N][K] weights (device
// tables t[0]/ts[0] of weight and scale pointers) with input row j/xdiv
// of x (row stride ldx); slot slots+i (i < dense) multiplies the dense
// weights w[0] (the shared expert) with input row xsh+i. Output slot j is
// row j of y ([slots+dense][N]). With up weights (t[1] and w[1]) every slot
// writes silu(gate)*up instead.
func (k *Set) ExpertsFP8(s cuda.Stream, y, x cuda.DevPtr, ldx, xdiv, xsh int, t, ts [2]cuda.DevPtr, ids cuda.DevPtr, slots int,
	w, ws [2]cuda.DevPtr, dense, N, K int) error {
	return k.ExpertsFP8Shaped(s, y, x, ldx, xdiv, xsh, t, ts, ids, slots, w, ws, dense, N, K, 0)
}

// ExpertsFP8Shaped is ExpertsFP8 whose launch shape is chosen as for
// shapeSlots slots (0: its own): the routed slots and the shared expert run
// as two launches (on two streams) give each slot the bits of the one
// launch over all of them.
func (k *Set) ExpertsFP8Shaped(s cuda.Stream, y, x cuda.DevPtr, ldx, xdiv, xsh int, t, ts [2]cuda.DevPtr, ids cuda.DevPtr, slots int,
	w, ws [2]cuda.DevPtr, dense, N, K, shapeSlots int) error {
	if N <= 0 || K <= 0 || slots < 0 || dense < 0 || slots+dense == 0 || xdiv <= 0 || xsh < 0 || ldx < K {
		return errors.Newf("experts: N=%d K=%d slots=%d dense=%d xdiv=%d xsh=%d ldx=%d", N, K, slots, dense, xdiv, xsh, ldx)
	}
	if slots > 0 && (t[0] == 0 || ids == 0) || dense > 0 && w[0] == 0 {
		return errors.Newf("experts: %d routed slots need tables and ids, %d dense slots weights", slots, dense)
	}
	if slots > 0 && dense > 0 && (t[1] == 0) != (w[1] == 0) {
		return errors.Newf("experts: gate-up pairing must hold for routed and dense slots alike")
	}
	if !TileOK(x, K, ldx, 1) {
		return errors.Newf("experts: K=%d ldx=%d x=%#x: needs K %% 16 == 0, ldx %% 4 == 0 and aligned x", K, ldx, uint64(x))
	}
	return k.tile(s, tileLaunch{t0: t[0], ts0: ts[0], t1: t[1], ts1: ts[1], ids: ids, slots: slots,
		w0: w[0], s0: ws[0], w1: w[1], s1: ws[1], dense: dense, x: x, ldx: ldx, xdiv: xdiv, xsh: xsh, y: y, ldy: N, N: N, K: K, M: 1,
		shapeSlots: shapeSlots})
}

// MoECombineSlots is MoECombine for M rows: out[m][n] = resid[m][n] (0 if
// resid is 0) + sum_j w[m][j]*y[m*kslots+j][n], each row's arithmetic
// exactly MoECombine's.
func (k *Set) MoECombineSlots(s cuda.Stream, out, y, w, resid cuda.DevPtr, M, kslots, N int) error {
	if M <= 0 || kslots <= 0 || N <= 0 {
		return errors.Newf("moe_combine_slots: M=%d k=%d N=%d", M, kslots, N)
	}
	return k.launch("moe_combine_slots", cuda.D3(cdiv(N, 256), M, 1), cuda.D1(256), 0, s, y, w, resid, out, kslots, N)
}

// Fused MoE combine + residual add + RMSNorm (moe_combine_norm_cl in
// cu/norm.cu): a cluster of moeNormCluster blocks a row, each playing
// add_rmsnorm_reg's warps [c*wpb, (c+1)*wpb), at most moeNormKMax slots a
// row (the kernel's MCN_CL, MCN_KMAX).
const (
	moeNormCluster = 8
	moeNormKMax    = 8
)

// MoENormFused says whether MoECombineNorm runs as one launch for
// rows of N floats with kslots slots (otherwise it runs MoECombineSlots and
// AddRMSNorm): the add_rmsnorm_reg shape (the fused kernel reproduces its
// reduction), k <= 8, an sm_90 device (thread block clusters).
func (k *Set) MoENormFused(kslots, N int) bool {
	return moeNormShapeOK(kslots, N) && k.c.Info().CCMajor >= 9
}

func moeNormShapeOK(kslots, N int) bool {
	return kslots >= 1 && kslots <= moeNormKMax && N > 0 && normRegsFit(N)
}

// moeNormBlock is the fused kernel's block for rows of N floats: the
// add_rmsnorm_reg launch's warps spread over the cluster.
func moeNormBlock(N int) int { return 32 * cdiv(normThreads(N)/32, moeNormCluster) }

// moeNormCheck refuses what MoECombineNorm cannot run.
func moeNormCheck(ny, x, out, y, w, nw cuda.DevPtr, M, kslots, N int) error {
	if M <= 0 || kslots <= 0 || N <= 0 || M > 65535 {
		return errors.WithHint(errors.Newf("moe_combine_norm_cl: M=%d k=%d N=%d", M, kslots, N),
			"M in 1..65535 rows, k >= 1 slots a row, N >= 1")
	}
	if ny == 0 || x == 0 || out == 0 || y == 0 || w == 0 || nw == 0 {
		return errors.WithHint(errors.Newf("moe_combine_norm_cl: null pointer (y %#x, x %#x, out %#x, slots %#x, weights %#x, norm %#x)",
			uint64(ny), uint64(x), uint64(out), uint64(y), uint64(w), uint64(nw)), "every pointer but resid is needed (resid 0: no residual rows)")
	}
	if ny == x || ny == out || x == out {
		return errors.WithHint(errors.Newf("moe_combine_norm_cl: y %#x, x %#x and out %#x must be distinct", uint64(ny), uint64(x), uint64(out)),
			"the norm output, the residual stream and the combine's output are three buffers")
	}
	return nil
}

// MoECombineNorm is MoECombineSlots(out, y, w, resid, M, kslots, N)
// then AddRMSNorm(ny, x, out, nw, M, N, N, N, N, eps) in one launch (rows
// of N contiguous floats): out = resid + the slots' weighted sum, x += out,
// ny = rmsnorm(x) * nw, bit-identical to the two. Where MoENormFused says
// no, it runs the two.
func (k *Set) MoECombineNorm(s cuda.Stream, ny, x, out, y, w, resid, nw cuda.DevPtr, M, kslots, N int, eps float32) error {
	if err := moeNormCheck(ny, x, out, y, w, nw, M, kslots, N); err != nil {
		return err
	}
	if !k.MoENormFused(kslots, N) {
		if err := k.MoECombineSlots(s, out, y, w, resid, M, kslots, N); err != nil {
			return err
		}
		return k.AddRMSNorm(s, ny, x, out, nw, M, N, N, N, N, eps)
	}
	return k.launch("moe_combine_norm_cl", cuda.D3(moeNormCluster, M, 1), cuda.D1(moeNormBlock(N)), 0, s,
		y, w, resid, out, x, nw, ny, kslots, N, normThreads(N), eps)
}
