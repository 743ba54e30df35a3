package gpu

import (
	"cmp"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"

	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/cuda"
	"github.com/tilert-go/tilert/cuda/kernels"
)

// device is the GPU as the engine sees it: memory, copies and the
// kernels, each with the semantics of the CUDA launcher of the same name in
// package cuda/kernels. Two implementations: cudaDevice (the GPU, inside
// cuda.Device.Do) and emuDevice (a pure-Go transcription of the kernels, so
// the engine's orchestration runs and is tested without a GPU).
type device interface {
	alloc(n int64) (cuda.DevPtr, error)
	free(p cuda.DevPtr) error
	// hostAlloc returns host memory for staging transfers (page-locked on
	// the GPU, so uploads are DMA without a driver bounce copy) and its free.
	hostAlloc(n int) ([]byte, func() error, error)
	upload(dst cuda.DevPtr, src []byte) error
	download(dst []byte, src cuda.DevPtr) error
	// downloadAsync queues a copy of src into dst (host memory from
	// hostAlloc) behind the work queued so far and returns at once; wait
	// blocks until dst holds the bytes (the pipelined step, ahead.go).
	//
	// Where aheadCopyOn the GPU's copy runs on a stream of its own after
	// the work queued so far, and the main stream goes on without it:
	// work queued before wait returns must not write src.
	downloadAsync(dst []byte, src cuda.DevPtr) (wait func() error, err error)
	// uploadBeside is upload for a forward's meta (beginMeta, where
	// aheadCopyOn): the GPU's copy runs on a stream of its own as soon as
	// the work queued before the previous uploadBeside is done, and the
	// main stream's later work waits for it, so the copy is off the main
	// stream's path. The caller alternates dst between two buffers (the
	// forward before last is the last reader of dst) and leaves a pinned
	// src unchanged until a later host wait on a download.
	uploadBeside(dst cuda.DevPtr, src []byte) error
	// launchQueued starts the work recorded so far without waiting for it
	// (graphDevice defers calls until a host sync point; the others run
	// every call as it comes).
	launchQueued() error
	// fork, unfork and join run the calls between fork and unfork on a
	// second stream beside those between unfork and join (side.go); rows
	// is the step's rows (the side chain's cap depends on it).
	fork(ch sideChain, rows int) error
	// raise puts the launches that follow at the runner's greatest
	// priority (on) or the stream's; prioMode is the runner's resolved
	// TILERT_GPU_MAIN_PRIO (prio.go).
	raise(on bool) error
	prioMode() prioMode
	unfork() error
	join() error
	copyDD(dst, src cuda.DevPtr, n int64) error
	zero(dst cuda.DevPtr, n int64) error
	sync() error

	gemvFP8(y, x, w, scale cuda.DevPtr, N, K, M, ldx, ldy int) error
	gemvBF16(y, x, w cuda.DevPtr, N, K, M, ldx, ldy int) error
	gemvF32(y, x, w cuda.DevPtr, N, K, M, ldx, ldy int) error
	gemvExperts(y, x cuda.DevPtr, xstride int, wTable, sTable, ids cuda.DevPtr, slots, N, K int) error
	// gemvSplitK writes the partials of one row through fp8 [N][K] cut
	// into splits column slices, slice j's into row j of y
	// (kernels.GemvFP8SplitK); splitKOK says whether it takes the shape.
	gemvSplitK(y, x, w, scale cuda.DevPtr, N, K, splits int) error
	splitKOK(N, K, splits int) bool
	// qbAbsorb runs a one-row q_b and its query absorption as one launch
	// (kernels.QBAbsorb); qbAbsorbOK says whether the device takes a.
	qbAbsorb(a kernels.QBAbsorbArgs) error
	qbAbsorbOK(a kernels.QBAbsorbArgs) bool
	// gemvGroup runs the GEMVs of segs over the same M <= kernels.MaxTileM
	// input rows x in one launch, x RMS-normalised first when norm.W is set
	// (kernels.GemvGroup: each output bit-identical to rmsnorm then the tile
	// GEMV alone).
	gemvGroup(x cuda.DevPtr, K, M, ldx int, segs []kernels.GroupSeg, norm kernels.GroupNorm) error
	gemmDevice
	// gateUp writes silu(wg x)*(wu x) for M <= kernels.MaxTileM rows of
	// fp8 [N][K] gate and up weights in one launch (kernels.GateUpFP8).
	gateUp(y, x, wg, sg, wu, su cuda.DevPtr, N, K, M, ldx, ldy int) error
	// experts runs every routed slot of a MoE projection plus dense (shared
	// expert) slots in one launch; gate-up paired when t[1], w[1] are set
	// (kernels.ExpertsFP8).
	experts(y, x cuda.DevPtr, ldx, xdiv, xsh int, t, ts [2]cuda.DevPtr, ids cuda.DevPtr, slots int, w, ws [2]cuda.DevPtr, dense, N, K int) error
	// expertsShaped is experts whose launch is shaped as one over
	// shapeSlots slots (kernels.ExpertsFP8Shaped): the same bits per slot
	// as that launch.
	expertsShaped(y, x cuda.DevPtr, ldx, xdiv, xsh int, t, ts [2]cuda.DevPtr, ids cuda.DevPtr, slots int, w, ws [2]cuda.DevPtr, dense, N, K, shapeSlots int) error
	// moeCombineSlots is moeCombine over M rows of k slots each, resid rows
	// of N (kernels.MoECombineSlots).
	moeCombineSlots(out, y, w, resid cuda.DevPtr, M, k, N int) error
	// moeUnique writes the table of n routed slots ids grouped by expert,
	// groups of at most mmax (kernels.MoEUnique; moe_unique.go).
	moeUnique(tab, ids cuda.DevPtr, n, mmax int) error
	// expertsUnique is expertsShaped's routed slots over moeUnique's table
	// for rows input rows: each group's expert read once, every slot's
	// output the per-slot launch's (kernels.ExpertsFP8Unique); mma: on the
	// tensor cores, each slot's output the one-row GemvFP8MMA's
	// (kernels.ExpertsFP8UniqueMMA).
	expertsUnique(y, x cuda.DevPtr, ldx, xdiv int, t, ts [2]cuda.DevPtr, tab cuda.DevPtr, slots, rows, N, K, shapeSlots int, mma bool) error
	// moeCombineNorm is moeCombineSlots(out, y, w, resid, M, k, N) then
	// addRMSNorm(ny, x, out, nw, M, N, N, N, N, eps), one launch where it
	// fits (kernels.MoECombineNorm; bit-identical to the two).
	moeCombineNorm(ny, x, out, y, w, resid, nw cuda.DevPtr, M, k, N int, eps float32) error
	rmsnorm(y, x, w cuda.DevPtr, rows, D, ldx, ldy int, eps float32) error
	layernorm(y, x, w, b cuda.DevPtr, rows, D, ldx, ldy int, eps float32) error
	rope(x, pos, cos, sin cuda.DevPtr, rows, rowsPerTok, ld, off, rot int, interleaved bool) error
	add(y, a, b cuda.DevPtr, n int) error
	// addRMSNorm is add(x, x, b) then rmsnorm(y, x, w) over rows rows in
	// one launch (bit-identical); y must not alias x or b.
	addRMSNorm(y, x, b, w cuda.DevPtr, rows, D, ldx, ldb, ldy int, eps float32) error
	siluMul(out, gate, up cuda.DevPtr, rows, I, ldg, ldu, ldo int) error
	// embed gathers rows ids of a bf16 [V][D] table; an id outside [0, V)
	// gives a NaN row (embedCheckOn, the default; the emulator always);
	// TILERT_GPU_EMBED_CHECK=0 reads outside the table instead.
	embed(out, table, ids cuda.DevPtr, T, D, V int) error
	moeCombine(out, y, w, resid cuda.DevPtr, k, N int) error
	moeRoute(idx, wts, logits, bias cuda.DevPtr, T, E, K, ngroup, topkGroup int, norm bool, scale float32) error
	// indexerScores reads the fp8 indexer pages, or (f32) the float32 key
	// cache of exact mode.
	indexerScores(f32 bool, out, q, w, cache, lens cuda.DevPtr, nq, H, T, ldOut int, qkScale float32) error
	// indexerQPrep is RoPE, the fp8 ue8m0 quantisation and the head-weight
	// scaling of the serving indexer query in one launch, into the layout
	// indexerScoresQ reads (kernels.Set.IndexerQPrep).
	indexerQPrep(qh, wq, q, w, pos, cos, sin cuda.DevPtr, M, H, rot int, interleaved bool, wscale float32) error
	// indexerScoresQ scores the fp8 pages with indexerQPrep's query on the
	// tensor cores (kernels.Set.IndexerScoresMMA); hist != 0 (a top-k
	// scratch) also builds the radix top-k's histogram for topKAfterHist.
	indexerScoresQ(out, qh, wq, cache, lens, hist cuda.DevPtr, nq, T, ldOut int) error
	// topKAfterHist is topK of scores that indexerScoresQ scored with
	// hist = scratch.
	topKAfterHist(out, scores, lens, scratch cuda.DevPtr, rows, T, K, ld, ldOut int) error
	// topK with scratch != 0 (kernels.TopKRadixScratchBytes(rows, T),
	// zeroed) spreads long rows over many blocks; the result is the same.
	topK(out, scores, lens, scratch cuda.DevPtr, rows, T, K, ld, ldOut int) error
	// mlaDecode reads an MLA cache of the given kind (fp8_ds_mla, bf16,
	// float32); ws (kernels.MLAHeadsWorkspaceBytes(rows, H), or 0) is
	// scratch for the split fp8 kernel.
	mlaDecode(kind mlaKind, out, qn, qp, cache, indices, lens, ws cuda.DevPtr, nq, H, nidx, ldIdx int, scale float32) error
	// mlaDecodeRows is mlaDecode over the fp8_ds_mla caches of several
	// slots in one launch: row r's region starts at rowBase[r] + cacheOff
	// (rowBase: nq int64 in device memory).
	mlaDecodeRows(out, qn, qp cuda.DevPtr, cacheOff int64, rowBase, indices, lens, ws cuda.DevPtr, nq, H, nidx, ldIdx int, scale float32) error
	// mlaPrefill is mlaDecode over the fp8_ds_mla cache for the many rows
	// of one slot's prefill chunk (TILERT_GPU_MLA_PREFILL=1, groups of
	// mlaPrefillMinRows rows or more): the same results, one kernel shaped
	// for many rows (mla_prefill_tc).
	// mlaPrefill's mode is TILERT_GPU_MLA_PREFILL's value for this call
	// (forward's prefillMLAMode: the fast prefill picks 6).
	mlaPrefill(mode int, out, qn, qp, cache, indices, lens, ws cuda.DevPtr, nq, H, nidx, ldIdx int, scale float32) error
	// indexerScoresQRows is indexerScoresQ over several slots' pages in one
	// launch (row r's at rowBase[r] + cacheOff).
	indexerScoresQRows(out, qh, wq cuda.DevPtr, cacheOff int64, rowBase, lens, hist cuda.DevPtr, nq, T, ldOut int) error
	// argmax with scratch != 0 (kernels.ArgmaxScratchBytes(rows), zeroed)
	// spreads each row over many blocks; the result is the same.
	argmax(out, x, scratch cuda.DevPtr, rows, n, ld int) error
	// sample with scratch != 0 (kernels.SampleScratchBytes(1), zeroed)
	// spreads the row over many blocks (kernels.SampleWide).
	sample(out, logits, scratch cuda.DevPtr, n int, p kernels.SamplingParams) error
	// adjustLogits applies n entries (kernels.AdjustWords int32 each) to
	// logits [rows][ld]; logprobs is kernels.Set.Logprobs.
	adjustLogits(x, entries cuda.DevPtr, n, ld int) error
	logprobs(x, tok, lp, topID, topLP cuda.DevPtr, rows, n, ld, k int) error
	mlaCacheWrite(kind mlaKind, cache, src, pos cuda.DevPtr, n, ld int) error
	idxCacheWrite(f32 bool, cache, src, pos cuda.DevPtr, n, ld int) error
	quantUE8M0(x cuda.DevPtr, n int) error
	copy2D(dst, src cuda.DevPtr, rows, cols, ldd, lds int) error
	scale(x cuda.DevPtr, a float32, n int) error
	// absorbQ with qpe != 0 also copies the RoPE part of q (P values after
	// each head's nope) into qpe [M][H][P], rotated by rope (rope's
	// semantics, one position per row; the zero value: not rotated).
	// absorbQ's qs, when on, scales every output by RMSNorm's r
	// (TILERT_GPU_QA_NORM=late: q is q_b of q_a times the norm's weight).
	absorbQ(out, qpe, q, w, s cuda.DevPtr, fp8 bool, M, H, nope, R, ldq, hs, P int, rope kernels.QRope, qs kernels.QScale) error
	// qaLate says how many per-block sums of q_a's squares the layer-input
	// group writes (segment sg of K columns) where this device takes
	// TILERT_GPU_QA_NORM=late for M rows with these absorb shapes; 0 where
	// it does not (qa_norm.go).
	qaLate(M int, sg kernels.GroupSeg, K, nope, R, hs, P int) int
	absorbV(out, x, w, s cuda.DevPtr, fp8 bool, M, H, vd, R, ldo int) error
	fusedDevice
	commDevice // comm.go
}

// fusedDevice holds the fused per-row launch (kernels/fused.go), the same
// bits as the run of launches it replaces (TILERT_GPU_FUSE=0 keeps that
// run).
type fusedDevice interface {
	// attnEpilogue is rmsnorm + rope + mlaCacheWrite (fp8) of the latent
	// rows, layernorm + rope + idxCacheWrite (fp8) of the indexer keys and
	// indexerQPrep, each part when its output is set (kernels.AttnEpilogue).
	attnEpilogue(a kernels.AttnEpilogue) error
}

// cudaDevice runs on the device thread (valid only inside Device.Do); all
// work goes to the context's stream, in order.
type cudaDevice struct {
	c *cuda.Ctx
	k *kernels.Set
	s cuda.Stream
	// ev is the runner's event for downloadAsync (created on first use).
	ev *cuda.Event
	// cp: the runner's copy streams (aheadCopyOn; nil: every copy on s).
	cp *copyStreams
	// gemmWS is the one-part GEMM's scratch (its runner's).
	gemmWS      cuda.DevPtr
	gemmWSBytes int64
	// side is the runner's second stream (side.go; nil: none, fork runs
	// the calls in order).
	side *sideStream
	// clk, when set, is cut before every host wait (ClockPrefill, clock.go).
	clk *devClock
	// qbVariant: q_b's one-row tile variant ("" without one; sideOpen, per
	// step in sideCap).
	qbVariant string
	// prio: the runner's resolved TILERT_GPU_MAIN_PRIO (prio.go; not off:
	// graphs keep their kernel nodes' priorities), prioHi its greatest
	// priority, raised whether the launches now go at it (raise).
	prio   prioMode
	prioHi int
	raised bool
}

var _ device = (*cudaDevice)(nil)

func (b *cudaDevice) alloc(n int64) (cuda.DevPtr, error) { return b.c.Alloc(n) }
func (b *cudaDevice) free(p cuda.DevPtr) error           { return b.c.Free(p) }

func (b *cudaDevice) hostAlloc(n int) ([]byte, func() error, error) {
	h, err := b.c.HostAlloc(n)
	if err != nil {
		return nil, nil, err
	}
	c := b.c
	return h.Bytes, func() error { return c.FreeHost(h) }, nil
}

// upload is asynchronous on the stream: from pageable memory the driver
// stages the bytes before cuMemcpyHtoDAsync returns, from pinned memory it
// does not, so callers that reuse a pinned source sync first.
func (b *cudaDevice) upload(dst cuda.DevPtr, src []byte) error {
	return b.c.CopyHtoDAsync(dst, src, b.s)
}

func (b *cudaDevice) download(dst []byte, src cuda.DevPtr) error {
	if err := b.c.CopyDtoHAsync(dst, src, b.s); err != nil {
		return err
	}
	b.cut()
	return b.c.SyncStream(b.s)
}

// cut closes the clock's segment before a host wait (clock.go).
func (b *cudaDevice) cut() {
	if b.clk != nil {
		b.clk.cut()
	}
}

func (b *cudaDevice) downloadAsync(dst []byte, src cuda.DevPtr) (func() error, error) {
	if *b.ev == 0 {
		ev, err := b.c.NewEvent()
		if err != nil {
			return nil, err
		}
		*b.ev = ev
	}
	s := b.s
	if aheadCopyOn && b.cp != nil {
		if err := b.cp.ensure(b.c); err != nil {
			return nil, err
		}
		if err := b.c.Record(b.cp.at, b.s); err != nil {
			return nil, err
		}
		if err := b.c.WaitEvent(b.cp.down, b.cp.at); err != nil {
			return nil, err
		}
		s = b.cp.down
	}
	if err := b.c.CopyDtoHAsync(dst, src, s); err != nil {
		return nil, err
	}
	b.cut()
	ev, c := *b.ev, b.c
	if err := c.Record(ev, s); err != nil {
		return nil, err
	}
	return func() error { return c.EventSync(ev) }, nil
}

func (b *cudaDevice) uploadBeside(dst cuda.DevPtr, src []byte) error {
	cp := b.cp
	if cp == nil {
		return b.upload(dst, src)
	}
	if err := cp.ensure(b.c); err != nil {
		return err
	}
	c := b.c
	if !cp.marked {
		// The first: after everything queued so far.
		if err := c.Record(cp.mark, b.s); err != nil {
			return err
		}
		cp.marked = true
	}
	// A wait takes the event's record at the time of the call, so mark
	// is re-recorded (for the next upload) after the copy's wait.
	if err := c.WaitEvent(cp.up, cp.mark); err != nil {
		return err
	}
	if err := c.Record(cp.mark, b.s); err != nil {
		return err
	}
	if err := c.CopyHtoDAsync(dst, src, cp.up); err != nil {
		return err
	}
	if err := c.Record(cp.upDone, cp.up); err != nil {
		return err
	}
	return c.WaitEvent(b.s, cp.upDone)
}

// copyStreams are a runner's two copy streams (aheadCopyOn, ahead.go): the
// picks' download on down, the next forward's meta on up, so that neither
// sits on the main stream between one step's graph and the next. Created
// on first use.
type copyStreams struct {
	up, down cuda.Stream
	// at: the main stream's tail at a download (down waits for it); mark:
	// its tail at the last uploadBeside (the next upload waits for it;
	// marked once recorded); upDone: the last upload's end (the main
	// stream waits for it).
	at, mark, upDone cuda.Event
	marked           bool
}

func (cp *copyStreams) ensure(c *cuda.Ctx) error {
	if cp.up != 0 {
		return nil
	}
	var made copyStreams
	err := func() error {
		var err error
		if made.up, err = c.NewStream(); err != nil {
			return err
		}
		if made.down, err = c.NewStream(); err != nil {
			return err
		}
		for _, e := range []*cuda.Event{&made.at, &made.mark, &made.upDone} {
			if *e, err = c.NewSyncEvent(); err != nil {
				return err
			}
		}
		return nil
	}()
	if err != nil {
		return errors.CombineErrors(err, made.destroy(c))
	}
	*cp = made
	return nil
}

func (cp *copyStreams) destroy(c *cuda.Ctx) error {
	var err error
	for _, e := range []cuda.Event{cp.at, cp.mark, cp.upDone} {
		if e != 0 {
			err = errors.CombineErrors(err, c.DestroyEvent(e))
		}
	}
	for _, s := range []cuda.Stream{cp.up, cp.down} {
		if s != 0 {
			err = errors.CombineErrors(err, c.DestroyStream(s))
		}
	}
	*cp = copyStreams{}
	return err
}

func (b *cudaDevice) launchQueued() error { return nil }

func (b *cudaDevice) copyDD(dst, src cuda.DevPtr, n int64) error {
	if n == 0 {
		return nil
	}
	return b.c.CopyDtoD(dst, src, n, b.s)
}

func (b *cudaDevice) zero(dst cuda.DevPtr, n int64) error {
	if n == 0 {
		return nil
	}
	return b.c.MemsetD8(dst, 0, n, b.s)
}

func (b *cudaDevice) sync() error {
	b.cut()
	return b.c.SyncStream(b.s)
}

// gemvFP8, gemvBF16 and gemvExperts choose the GEMV kernel. The tile
// kernels (kernels.GemvFP8Tile: x reused across the rows a thread streams,
// split-K sized by K, up to 8 input rows per launch) take every fp8 GEMV
// and the bf16 ones of more than 4 rows below the head unless
// TILERT_GPU_GEMV_TILE=0. Without
// them: the wide kernels (kernels.GemvFP8Wide) for matrices of at most
// gemvWideMaxRows rows (times expert slots), where the warp-per-row grid
// cannot fill the SMs; the H200 run of docs/measured/h200-2026-12-01-gemv
// measured them 1.5-3x faster there (fp8 256/576 x 7168, bf16 64/256 x 7168)
// and 0.5-0.9x on the large matrices (x re-read per row). TILERT_GPU_GEMV_WIDE=0
// keeps the warp-per-row kernels everywhere, =1 takes the wide ones everywhere
// but the head (comparisons). Those take at most 4 rows a launch.
func (b *cudaDevice) gemvFP8(y, x, w, scale cuda.DevPtr, N, K, M, ldx, ldy int) error {
	if b.useMMA(x, w, N, K, M, ldx, 1) {
		return b.k.GemvFP8MMA(b.s, y, x, w, scale, 0, N, K, M, ldx, ldy)
	}
	if gemvTileOn {
		return b.k.GemvFP8Tile(b.s, y, x, w, scale, 0, N, K, M, ldx, ldy)
	}
	return rows4(y, x, M, ldx, ldy, func(y, x cuda.DevPtr, m int) error {
		if gemvWide(N) {
			return b.k.GemvFP8Wide(b.s, y, x, w, scale, 0, N, K, m, ldx, ldy)
		}
		return b.k.GemvFP8(b.s, y, x, w, scale, 0, N, K, m, ldx, ldy)
	})
}

// rows4 runs a GEMV of at most 4 rows over M rows.
func rows4(y, x cuda.DevPtr, M, ldx, ldy int, f func(y, x cuda.DevPtr, m int) error) error {
	for r := 0; r < M; r += 4 {
		if err := f(fptr(y, r*ldy), fptr(x, r*ldx), min(4, M-r)); err != nil {
			return err
		}
	}
	return nil
}

const (
	gemvWideMaxRows  = 1024
	gemvBF16WideMaxN = 16384 // with =1: below the head
)

var gemvWideMode = os.Getenv("TILERT_GPU_GEMV_WIDE")

// gemvTileOn: TILERT_GPU_GEMV_TILE=0 keeps the GEMVs of before the tile
// kernels and the per-row MoE (comparisons); =1, =2 and =3 pick the tile
// kernels' shape rule (kernels.TileRule; unset: its default).
var (
	gemvTileMode = os.Getenv("TILERT_GPU_GEMV_TILE")
	gemvTileOn   = gemvTileMode != "0"
)

func init() {
	if r := tileRuleOf(gemvTileMode); r > 0 {
		kernels.TileRule = r
	}
}

// TILERT_GPU_EXPERT_SHAPE=0 keeps a single row's routed-expert launches on the
// tile rule's shapes; unset (or 1), their own (kernels.OneRowExperts: the
// gate/up on _o4 on an H200, the down on groups of 32 where its last wave
// is fuller, session 48); 30 session 30's (gate/up on _o4 and the down on
// groups of 32 on every card); o4 / d16 the default with the gate/up on
// that variant on every card.
func init() {
	// TILERT_GPU_WHOLE_CHUNKS=0: a single row's dense 1536-byte rows (q_b,
	// wq_b of DeepSeek-V3.2 dims) back on the rule's 64-thread groups
	// (kernels.OneRowWholeChunks, session 49).
	if os.Getenv("TILERT_GPU_WHOLE_CHUNKS") == "0" {
		kernels.OneRowWholeChunks = false
	}
	switch os.Getenv("TILERT_GPU_EXPERT_SHAPE") {
	case "0":
		kernels.OneRowExperts = false
	case "30":
		kernels.ExpertPair, kernels.ExpertDownG32 = "o4", true
	case "o4", "d16":
		kernels.ExpertPair = os.Getenv("TILERT_GPU_EXPERT_SHAPE")
	}
}

// tileRuleOf is the tile rule TILERT_GPU_GEMV_TILE names (0: the default).
func tileRuleOf(mode string) int {
	switch mode {
	case "1", "2", "3":
		return int(mode[0] - '0')
	}
	return 0
}

func gemvWide(rows int) bool {
	switch gemvWideMode {
	case "0":
		return false
	case "1":
		return true
	}
	return rows <= gemvWideMaxRows
}

func (b *cudaDevice) gemvBF16(y, x, w cuda.DevPtr, N, K, M, ldx, ldy int) error {
	if b.useMMA(x, w, N, K, M, ldx, 2) {
		return b.k.GemvBF16MMA(b.s, y, x, w, 0, N, K, M, ldx, ldy)
	}
	// bf16 (router, indexer weights_proj: small N): the tile kernel measured
	// 0.8-0.9x the wide one up to 4 rows, so it takes only more rows.
	if gemvTileOn && M > 4 && N <= gemvBF16WideMaxN {
		return b.k.GemvBF16Tile(b.s, y, x, w, 0, N, K, M, ldx, ldy)
	}
	return rows4(y, x, M, ldx, ldy, func(y, x cuda.DevPtr, m int) error {
		if N <= gemvBF16WideMaxN && gemvWide(N) {
			return b.k.GemvBF16Wide(b.s, y, x, w, 0, N, K, m, ldx, ldy)
		}
		return b.k.GemvBF16(b.s, y, x, w, 0, N, K, m, ldx, ldy)
	})
}

// gemvMMAOn: the fp8 and bf16 GEMVs (and the paired gate/up) of 2..8
// rows run on the tensor cores (kernels.GemvFP8MMA, cu/gemv_mma.cu: each
// weight converted once to bf16 and multiplied with every row by mma.sync,
// x in three bf16 parts so the products are float32's), where the tile
// kernels spend M FMAs per weight and are issue-bound. H200, docs/measured/
// h200-2026-12-01-mrows run 1 (these kernels; graph-timed, weights cold):
// at 4 rows o_proj 76.6 -> 50.2 us, q_b 48.4 -> 19.4, head 965 -> 506,
// dense gate/up 164.5 -> 97.7; 4-slot step 8.000 ms (9.163 on main before,
// another session). Only matrices of at least mmaMinN rows (below, the
// MMA grid of 16-64 rows a block leaves SMs idle), and at 2 rows only
// short fp8 rows and bf16 (mmaM2MaxKBytes).
// TILERT_GPU_GEMV_MMA unset takes run 2's fastest variant per shape
// (docs/measured/h200-2026-12-03-s18 call B; kernels.mmaShape: the second
// iteration's `_p` for long fp8 rows, the paired gate/up and wq_b) and
// puts the grouped attention inputs (q_a, kv_a, indexer wk and
// weights_proj, no norm) of 2..8 rows on the tensor cores (groupMinM)
// (kernels.GemvGroupMMA: 2304 x 7168 at 4 rows 15.9 against 34.3 us on the
// tile group kernel). 4-slot step at 8192 (call C, the same run):
// DeepSeek-V3.2 dims 6.009 -> 5.718 ms, GLM-5 5.719 -> 5.367. =1 goes back
// to run 1's choices (gemv_mma.cu everywhere, the group on the tile
// kernel); =0 keeps the tile kernels; =all takes every shape (the tiny
// models' checks); =g1 the group on the tensor cores at one
// row too (slower: 2.883 against 2.679 ms at 1 slot); =u2 session 18's
// group (gemv_mmx_group_u2 from 3 rows; session 19 made u4 from 2 rows the
// default: 2304 x 7168 at 4 rows 15.9 against 18.8 us, the MTP step 4.887
// against 5.121 ms); =g3 the group from 3 rows. =x / =xall (the cp.async
// variants, slower: 6.503 against 6.013 ms) were removed in session 19
// (removed.go refuses them).
var (
	gemvMMAMode   = os.Getenv("TILERT_GPU_GEMV_MMA")
	gemvMMAOn     = gemvMMAMode != "0"
	gemvMMAAll    = gemvMMAMode == "all"
	gemvMMAGroup  = gemvMMAOn && gemvMMAMode != "1"
	gemvGroupMinM = groupMinM(gemvMMAMode)
)

// groupMinM is the fewest rows whose attention-input group takes the
// tensor cores: 2 by default since session 19 (call B, the same run: the
// MTP step, whose main layers run 2 rows, 4.887 ms with the group there on
// u4 against 5.055 without; session 18's call C had reported the opposite,
// 5.055 with the group on u2 against 4.906), 3 with
// =g3 or =u2 (session 18's default), 1 with =g1; =g is the default's 2.
func groupMinM(mode string) int {
	switch mode {
	case "g1":
		return 1
	case "g3", "u2":
		return 3
	}
	return 2
}

func init() {
	if gemvMMAMode == "1" {
		kernels.MMARun1 = true
	}
	if gemvMMAMode == "u2" {
		kernels.MMAGroupU2 = true
	}
}

const mmaMinN = 2048

func (b *cudaDevice) useMMA(x, w cuda.DevPtr, N, K, M, ldx, esize int) bool {
	return mmaRule(N, K*esize, M, esize == 2) && b.k.MMAOK(x, w, K, ldx, M, esize)
}

// mmaRule says whether a GEMV of M rows over N weight rows of kbytes bytes
// takes the tensor-core kernels (before the shape checks).
func mmaRule(N, kbytes, M int, bf16 bool) bool {
	if !gemvMMAOn || M < 2 {
		return false
	}
	return gemvMMAAll || (N >= mmaMinN && (M > 2 || kbytes < mmaM2MaxKBytes || bf16))
}

// mmaM2MaxKBytes: at 2 rows the tile kernels still stream long fp8 rows
// faster (run 1: o_proj 40.4 us against 49.3, dense down 44.9 / 54.9,
// gate/up 87.8 / 93.5), short ones and the bf16 head slower (q_b 22.1 /
// 17.4, indexer wq_b 8.8 / 7.4, head 496 / 461).
const mmaM2MaxKBytes = 4096

func (b *cudaDevice) gemvF32(y, x, w cuda.DevPtr, N, K, M, ldx, ldy int) error {
	return rows4(y, x, M, ldx, ldy, func(y, x cuda.DevPtr, m int) error {
		return b.k.GemvF32(b.s, y, x, w, 0, N, K, m, ldx, ldy)
	})
}

func (b *cudaDevice) gemvExperts(y, x cuda.DevPtr, xstride int, wTable, sTable, ids cuda.DevPtr, slots, N, K int) error {
	if gemvWide(N * slots) {
		return b.k.GemvFP8ExpertsWide(b.s, y, x, xstride, wTable, sTable, ids, slots, N, K)
	}
	return b.k.GemvFP8Experts(b.s, y, x, xstride, wTable, sTable, ids, slots, N, K)
}

func (b *cudaDevice) gemvGroup(x cuda.DevPtr, K, M, ldx int, segs []kernels.GroupSeg, norm kernels.GroupNorm) error {
	if len(segs) > 0 && segs[0].OutW != 0 {
		// TILERT_GPU_QA_NORM=late's group: gemv_group_r8_m1_qw only.
		return b.k.GemvGroup(b.s, x, K, M, ldx, segs, norm)
	}
	if gemvMMAGroup && M >= gemvGroupMinM && norm.W == 0 && b.k.GroupMMAOK(x, K, ldx, M, segs) {
		rows := 0
		for _, sg := range segs {
			rows += sg.N
		}
		if rows >= mmaMinN || gemvMMAAll {
			return b.k.GemvGroupMMA(b.s, x, K, M, ldx, segs)
		}
	}
	// The mid kernels take the K = 1536 launch of q_b + wq_b (with the
	// rmsnorm before it: 20.65 against 24.50 us for today's three launches,
	// H200, session 9); the layer input's 2304 x 7168 group stays on
	// gemv_group, which measured faster (9.70 against 11.22 us).
	if midRows(M) && K <= midMaxK && b.gemvMidReady() {
		_, err := b.k.GemvGroupMid(b.s, x, K, M, ldx, segs, norm, gemvMidShape)
		return err
	}
	return b.k.GemvGroup(b.s, x, K, M, ldx, segs, norm)
}

func (b *cudaDevice) gateUp(y, x, wg, sg, wu, su cuda.DevPtr, N, K, M, ldx, ldy int) error {
	if b.useMMA(x, wg, N, K, M, ldx, 1) && uint64(wu)%16 == 0 {
		return b.k.GateUpFP8MMA(b.s, y, x, wg, sg, wu, su, N, K, M, ldx, ldy)
	}
	return b.k.GateUpFP8(b.s, y, x, wg, sg, wu, su, N, K, M, ldx, ldy)
}

func (b *cudaDevice) experts(y, x cuda.DevPtr, ldx, xdiv, xsh int, t, ts [2]cuda.DevPtr, ids cuda.DevPtr, slots int, w, ws [2]cuda.DevPtr, dense, N, K int) error {
	return b.k.ExpertsFP8(b.s, y, x, ldx, xdiv, xsh, t, ts, ids, slots, w, ws, dense, N, K)
}

func (b *cudaDevice) expertsShaped(y, x cuda.DevPtr, ldx, xdiv, xsh int, t, ts [2]cuda.DevPtr, ids cuda.DevPtr, slots int, w, ws [2]cuda.DevPtr, dense, N, K, shapeSlots int) error {
	return b.k.ExpertsFP8Shaped(b.s, y, x, ldx, xdiv, xsh, t, ts, ids, slots, w, ws, dense, N, K, shapeSlots)
}

func (b *cudaDevice) moeCombineSlots(out, y, w, resid cuda.DevPtr, M, k, N int) error {
	return b.k.MoECombineSlots(b.s, out, y, w, resid, M, k, N)
}

func (b *cudaDevice) moeCombineNorm(ny, x, out, y, w, resid, nw cuda.DevPtr, M, k, N int, eps float32) error {
	return b.k.MoECombineNorm(b.s, ny, x, out, y, w, resid, nw, M, k, N, eps)
}

func (b *cudaDevice) rmsnorm(y, x, w cuda.DevPtr, rows, D, ldx, ldy int, eps float32) error {
	return b.k.RMSNorm(b.s, y, x, w, rows, D, ldx, ldy, eps)
}

func (b *cudaDevice) layernorm(y, x, w, bb cuda.DevPtr, rows, D, ldx, ldy int, eps float32) error {
	return b.k.LayerNorm(b.s, y, x, w, bb, rows, D, ldx, ldy, eps)
}

func (b *cudaDevice) rope(x, pos, cos, sin cuda.DevPtr, rows, rowsPerTok, ld, off, rot int, interleaved bool) error {
	return b.k.RoPE(b.s, x, pos, cos, sin, rows, rowsPerTok, ld, off, rot, interleaved)
}

func (b *cudaDevice) add(y, a, bb cuda.DevPtr, n int) error { return b.k.Add(b.s, y, a, bb, n) }

func (b *cudaDevice) addRMSNorm(y, x, bb, w cuda.DevPtr, rows, D, ldx, ldb, ldy int, eps float32) error {
	return b.k.AddRMSNorm(b.s, y, x, bb, w, rows, D, ldx, ldb, ldy, eps)
}

func (b *cudaDevice) siluMul(out, gate, up cuda.DevPtr, rows, I, ldg, ldu, ldo int) error {
	return b.k.SiluMul(b.s, out, gate, up, rows, I, ldg, ldu, ldo)
}

func (b *cudaDevice) embed(out, table, ids cuda.DevPtr, T, D, V int) error {
	if embedCheckOn {
		return b.k.EmbedBF16Checked(b.s, out, table, ids, T, D, V)
	}
	return b.k.EmbedBF16(b.s, out, table, ids, T, D)
}

func (b *cudaDevice) moeCombine(out, y, w, resid cuda.DevPtr, k, N int) error {
	return b.k.MoECombine(b.s, out, y, w, resid, k, N)
}

func (b *cudaDevice) moeRoute(idx, wts, logits, bias cuda.DevPtr, T, E, K, ngroup, topkGroup int, norm bool, scale float32) error {
	return b.k.MoERoute(b.s, idx, wts, logits, bias, T, E, K, ngroup, topkGroup, norm, scale)
}

func (b *cudaDevice) indexerScores(f32 bool, out, q, w, cache, lens cuda.DevPtr, nq, H, T, ldOut int, qkScale float32) error {
	if f32 {
		return b.k.EngIndexerScoresF32(b.s, out, q, w, cache, lens, nq, H, T, ldOut, qkScale)
	}
	if T >= kernels.TopKWideMinT && topkWideOn {
		return b.k.IndexerScoresWide(b.s, out, q, w, cache, 0, lens, nq, H, T, ldOut, qkScale)
	}
	return b.k.IndexerScores(b.s, out, q, w, cache, 0, lens, nq, H, T, ldOut, qkScale)
}

func (b *cudaDevice) indexerQPrep(qh, wq, q, w, pos, cos, sin cuda.DevPtr, M, H, rot int, interleaved bool, wscale float32) error {
	return b.k.IndexerQPrep(b.s, qh, wq, q, w, pos, cos, sin, M, H, rot, interleaved, wscale)
}

func (b *cudaDevice) indexerScoresQ(out, qh, wq, cache, lens, hist cuda.DevPtr, nq, T, ldOut int) error {
	if b.idxWGHOK(nq, T) {
		if idxWGHPair(idxWGH, nq, T) {
			return b.k.IndexerScoresWGH2(b.s, out, qh, wq, cache, 0, lens, hist, nq, T, ldOut)
		}
		return b.k.IndexerScoresWGH(b.s, out, qh, wq, cache, 0, lens, hist, nq, T, ldOut)
	}
	return b.k.IndexerScoresMMA(b.s, out, qh, wq, cache, 0, lens, hist, nq, T, ldOut)
}

// idxWGH: TILERT_GPU_IDX_WGH scores the indexer's fp8 pages on
// indexer_scores_wgh (the sm_90a module: the keys as wgmma's M, the query
// read by the tensor cores; kernels.Set.IndexerScoresWGH) instead of
// indexer_scores_mma_pf: unset (or 2), every launch, those of fewer than
// idxWGHPairKeys keys on the two-warpgroup blocks (kernels.IndexerScoresWGH2,
// session 42 at idxWGHShortKeys or fewer, session 43 up to idxWGHPairKeys);
// 2short, session 42's rule, kept for comparisons; long, only launches of
// more than idxWGHShortKeys (session 40's default: _pf below); 1 every
// launch on indexer_scores_wgh; 0 none. Where the module does not load,
// _pf runs, said once in the log.
var idxWGH = os.Getenv("TILERT_GPU_IDX_WGH")

// idxWGHRule: the launches indexer_scores_wgh (or _wgh2, idxWGHPair) take
// under mode. Every launch unless 0 or long; long: more than 65536 keys
// over the launch's rows (H200, session 40 call A,
// graph-timed scores + histogram, cold keys: 1 x 131072 9.58 against _pf's
// 11.33 us, 4 x 32768 8.67 / 10.80, 4 x 131072 22.10 / 33.19, but 1 x 32768
// 6.16 / 5.28 and 1 x 8256 3.98 / 3.71; the step at 131072, 9 MoE layers,
// A/B/A/B: GLM-5 dims -21 / -16 us, DeepSeek-V3.2 -13 / -6; 8192 within
// +-2 us). The launches of 65536 keys or fewer went to _wgh2 in session 42
// (graph-timed scores + histogram, cold keys, session 42 call B: 1 x 8256
// 3.50 us against _pf's 3.76, 4 x 8256 4.56 / 5.13, 1 x 32768 4.96 /
// 5.38; the step at 8192, 9 MoE layers, 1 slot, A/B/A/B p50: GLM-5 dims
// 2.647 / 2.649 ms against 2.642 / 2.641, DeepSeek-V3.2 2.586 / 2.590
// against 2.590 / 2.588, inside its spread).
func idxWGHRule(mode string, nq, T int) bool {
	switch mode {
	case "0":
		return false
	case "long":
		return nq*T > idxWGHShortKeys
	}
	return true
}

// The rules' bounds on a launch's keys (its rows times T): idxWGHShortKeys
// is where session 40 measured _pf ahead of wgh (=long) and session 42
// first took wgh2 (=2short); below idxWGHPairKeys wgh2 is the default.
const (
	idxWGHShortKeys = 65536
	idxWGHPairKeys  = 1 << 19
)

// idxWGHPair: the launch takes indexer_scores_wgh2: unset or 2, launches
// of fewer than 2^19 keys (session 43); 2short, 65536 or fewer. Graph-timed
// scores + histogram, cold keys (H200, session 42 call B), wgh2 against
// wgh: 1 x 131072 8.96 against 9.77 us, 4 x 32768 8.13 / 8.68, but 4 x
// 131072 22.50 / 22.17: the two-warpgroup blocks win until a launch's pages
// fill several rounds of the grid. The step at 131072 (one H100, 3 MoE
// layers, 1 slot, A/B/A/B, session 43 call A): GLM-5 dims -3 / -7 us,
// DeepSeek-V3.2 0 / -2.
func idxWGHPair(mode string, nq, T int) bool {
	switch mode {
	case "", "2":
		return nq*T < idxWGHPairKeys
	case "2short":
		return nq*T <= idxWGHShortKeys
	}
	return false
}

var idxWGHOnce sync.Once

// idxWGHOK: indexer_scores_wgh takes this scores launch.
func (b *cudaDevice) idxWGHOK(nq, T int) bool {
	if !idxWGHRule(idxWGH, nq, T) {
		return false
	}
	err := b.k.WGSupported()
	idxWGHOnce.Do(func() {
		if err != nil {
			slog.Warn("indexer_scores_wgh is unavailable (needs sm_90a: an H100/H200 and NVRTC 12+); the indexer scores run on indexer_scores_mma_pf", "err", err)
			return
		}
		slog.Info("the indexer scores on indexer_scores_wgh / _wgh2 (sm_90a module, wgmma, keys as M; TILERT_GPU_IDX_WGH=0 goes back to indexer_scores_mma_pf)")
	})
	return err == nil
}

func (b *cudaDevice) topKAfterHist(out, scores, lens, scratch cuda.DevPtr, rows, T, K, ld, ldOut int) error {
	if b.topkFastOK(T, K) {
		fastTopKLaunches.Add(1)
		return b.k.TopKFastAfterHist(b.s, out, scores, lens, scratch, rows, T, K, ld, ldOut)
	}
	return b.k.TopKRadixAfterHistWith(b.s, out, scores, lens, scratch, rows, T, K, ld, ldOut, topkRadixFinal)
}

func (b *cudaDevice) topK(out, scores, lens, scratch cuda.DevPtr, rows, T, K, ld, ldOut int) error {
	if scratch != 0 && T > K && topkRadixOn && b.topkFastOK(T, K) {
		fastTopKLaunches.Add(1)
		return b.k.TopKFast(b.s, out, scores, lens, scratch, rows, T, K, ld, ldOut)
	}
	if scratch != 0 && T > K && topkRadixOn {
		return b.k.TopKRadixWith(b.s, out, scores, lens, scratch, rows, T, K, ld, ldOut, topkRadixFinal)
	}
	if scratch != 0 && T >= kernels.TopKWideMinT && topkWideOn {
		return b.k.TopKWide(b.s, out, scores, lens, scratch, rows, T, K, ld, ldOut)
	}
	return b.k.TopK(b.s, out, scores, lens, rows, T, K, ld, ldOut)
}

// mlaDecode over the fp8 cache runs on tensor cores (16 heads a block, each
// entry dequantised once per block, tokens split over the SMs) when given
// scratch; TILERT_GPU_MLA_TC=0 falls back to the float32 heads-as-M kernel
// and TILERT_GPU_MLA_HEADS=0 further to one block per head (comparisons).
// The wide caches of exact mode and bf16 keep their unsplit kernels.
func (b *cudaDevice) mlaDecode(kind mlaKind, out, qn, qp, cache, indices, lens, ws cuda.DevPtr, nq, H, nidx, ldIdx int, scale float32) error {
	switch kind {
	case mlaF32:
		return b.k.EngMLADecodeF32(b.s, out, qn, qp, cache, indices, lens, nq, H, nidx, ldIdx, scale)
	case mlaBF16:
		return b.k.EngMLADecodeBF16(b.s, out, qn, qp, cache, indices, lens, nq, H, nidx, ldIdx, scale)
	}
	if ws != 0 && b.mlaFewOK(nq, H) {
		fewMLALaunches.Add(1)
		return b.k.MLADecodeFew(b.s, out, 0, qn, qp, cache, 0, 0, indices, lens, ws, nq, H, nidx, ldIdx, scale)
	}
	if ws != 0 && b.mlaWGOK(nq, H) {
		mlaWGLaunches.Add(1)
		return b.k.MLADecodeWG2(b.s, out, 0, qn, qp, cache, 0, 0, indices, lens, ws, nq, H, nidx, ldIdx, b.k.MLAWG2Splits(nq, H, nidx), scale)
	}
	if ws != 0 && mlaTCOn && b.c.Info().CCMajor >= 8 {
		if mlaTCF != "" && b.c.Info().CCMajor >= 9 {
			return b.mlaDecodeTCF(out, qn, qp, cache, 0, indices, lens, ws, nq, H, nidx, ldIdx, scale)
		}
		ns := b.k.MLATCSplits(nq, H, nidx)
		if mlaTCPOn {
			return b.k.MLADecodeTCP(b.s, out, 0, qn, qp, cache, 0, indices, lens, ws, nq, H, nidx, ldIdx, ns, scale)
		}
		return b.k.MLADecodeTC(b.s, out, 0, qn, qp, cache, 0, indices, lens, ws, nq, H, nidx, ldIdx, ns, scale)
	}
	if ws != 0 && mlaHeadsOn {
		ns := b.k.MLAHeadsSplits(nq, H, nidx)
		return b.k.MLADecodeHeads(b.s, out, 0, qn, qp, cache, 0, indices, lens, ws, nq, H, nidx, ldIdx, ns, scale)
	}
	return b.k.MLADecode(b.s, out, 0, qn, qp, cache, 0, indices, lens, 0, nq, H, nidx, ldIdx, 1, scale)
}

// mlaPrefill runs mode's kernel (TILERT_GPU_MLA_PREFILL's values) unsplit
// (the rows fill the SMs); below sm_80 it is mlaDecode.
func (b *cudaDevice) mlaPrefill(mode int, out, qn, qp, cache, indices, lens, ws cuda.DevPtr, nq, H, nidx, ldIdx int, scale float32) error {
	if b.c.Info().CCMajor < 8 {
		return b.mlaDecode(mlaFP8, out, qn, qp, cache, indices, lens, ws, nq, H, nidx, ldIdx, scale)
	}
	switch mode {
	case 2:
		return b.k.MLAPrefillTCP(b.s, out, 0, qn, qp, cache, 0, indices, lens, 0, nq, H, nidx, ldIdx, 1, scale)
	case 3:
		return b.k.MLAPrefillTCPI(b.s, out, 0, qn, qp, cache, 0, indices, lens, 0, nq, H, nidx, ldIdx, 1, scale)
	case 6:
		if b.mlaPrefillWGOK(6) {
			wg2Launches.Add(1)
			return b.k.MLAPrefillWG2(b.s, out, 0, qn, qp, cache, 0, indices, lens, nq, H, nidx, ldIdx, scale)
		}
		return b.mlaPrefillH1(out, qn, qp, cache, indices, lens, nq, H, nidx, ldIdx, scale)
	case 5:
		if b.mlaPrefillWGOK(5) {
			wgLaunches.Add(1)
			return b.k.MLAPrefillWG(b.s, out, 0, qn, qp, cache, 0, indices, lens, nq, H, nidx, ldIdx, scale)
		}
		fallthrough
	case 4:
		return b.mlaPrefillH1(out, qn, qp, cache, indices, lens, nq, H, nidx, ldIdx, scale)
	}
	return b.k.MLAPrefillTC(b.s, out, 0, qn, qp, cache, 0, indices, lens, 0, nq, H, nidx, ldIdx, 1, scale)
}

// mlaPrefillH1 is TILERT_GPU_MLA_PREFILL=4 (and =5 / =6 without sm_90a):
// mla_prefill_h1 from sm_89, else mla_prefill_tcp.
func (b *cudaDevice) mlaPrefillH1(out, qn, qp, cache, indices, lens cuda.DevPtr, nq, H, nidx, ldIdx int, scale float32) error {
	if b.k.MLAPrefillH1Supported() {
		return b.k.MLAPrefillH1(b.s, out, 0, qn, qp, cache, 0, indices, lens, nq, H, nidx, ldIdx, scale)
	}
	return b.k.MLAPrefillTCP(b.s, out, 0, qn, qp, cache, 0, indices, lens, 0, nq, H, nidx, ldIdx, 1, scale)
}

var (
	// wgOnce: mla_prefill_wg's availability is logged once a process.
	wgOnce sync.Once
	// wgLaunches counts mlaPrefill calls that ran mla_prefill_wg (tests:
	// =5 did not fall back).
	wgLaunches atomic.Int64
	// wg2Launches: the same for mla_prefill_wg2 (=6).
	wg2Launches atomic.Int64
)

// mlaWG: the decode step's fp8 sparse MLA on mla_decode_wg2 (the sm_90a
// module: mla_prefill_wg2's block, products on wgmma with one fp16 part,
// the selections split over the SMs, kernels.MLADecodeWG2) instead of
// mla_decode_tcf2 (two fp16 parts, mma.sync). Unset: where it measured
// faster (session 19 call C, graph-timed with the combine, 2048
// selections: 128 heads 1 row 16.4 against 18.8 us, 2 rows 21.0 / 28.4,
// 4 rows 26.3 / 46.0; 64 heads 1 row 15.6 / 15.0, 4 rows 21.3 / 28.8): 128
// heads or more, or 64 and more at 2 rows and more; the step, 8192, 9 MoE
// layers: DeepSeek-V3.2 dims 1 slot 2.702 -> 2.678 ms, 4 slots 5.757 ->
// 5.611; GLM-5 4 slots 5.407 -> 5.360. Since session 21 also one row of 64
// heads (mlaWGRule: 64 heads or more at any rows), where the block is
// mla_decode_wg2b: GLM-5 dims 1 slot 2.734 / 2.747 -> 2.719 ms at 8192,
// 2.884 / 2.890 -> 2.860 at 131072 (call D, A/B/A in one run, through =1;
// docs/measured/h200-2026-12-03-s21). =1 takes every launch of
// more heads than mla_decode_few's (the tiny models' checks), =0 none.
// Where the module does not load, the default kernel runs, said once in
// the log.
var mlaWG = os.Getenv("TILERT_GPU_MLA_WG")

// TILERT_GPU_MLA_WG2B=0: mla_decode_wg2 as session 19 ran it; unset (or
// 1), mla_decode_wg2b, the same bits with shorter latency chains at one
// tile a block (kernels.MLAWG2B).
func init() {
	if os.Getenv("TILERT_GPU_MLA_WG2B") == "0" {
		kernels.MLAWG2B = false
	}
	// TILERT_GPU_L2_EVICT=normal: the weight streams' and the indexer keys'
	// loads as before session 47; unset (or nogroup), evict-first in the L2
	// (kernels.EvictFirst), so that what a layer writes and the next reads
	// stays there, but for the grouped input GEMVs' (kernels.GroupNormal,
	// session 48); keys, those evict-first too (session 47's default; =first,
	// the weights alone, is refused: removed.go).
	// TILERT_GPU_BLOCK_CLOCKS=1: the kernels compiled with block clocks
	// (kernels.BlockClocks), read by a traced step (bench decode
	// --timeline): a diagnostic, each block's entry, release and exit.
	if os.Getenv("TILERT_GPU_BLOCK_CLOCKS") == "1" {
		kernels.BlockClocks = true
	}
	// TILERT_GPU_ROUTE_SORT=0: the routing on moe_route_rank; unset (or 1),
	// moe_route_sort, the same outputs (kernels.RouteSort, session 52).
	if os.Getenv("TILERT_GPU_ROUTE_SORT") == "0" {
		kernels.RouteSort = false
	}
	switch os.Getenv("TILERT_GPU_L2_EVICT") {
	case "normal":
		kernels.EvictFirst = false
	case "keys":
		kernels.GroupNormal = false
	}
	// TILERT_GPU_MLA_HEADS=64|32: one-tile decode MLA blocks of that many
	// heads (mla_decode_wg2h at 32, kernels.MLAHeadsPerBlock); unset, 32 for
	// one row of 64 heads (GLM-5) and 64 elsewhere (16 is refused,
	// removed.go; switchValues refuses other values).
	switch os.Getenv("TILERT_GPU_MLA_HEADS") {
	case "64":
		kernels.MLAHeadsPerBlock = 64
	case "32":
		kernels.MLAHeadsPerBlock = 32
	}
	// TILERT_GPU_TOPK_W12=0: the one-block top-k of rows in buckets of
	// 8193..12288 keys on topk_radix_one_w16 instead of the default
	// topk_radix_one_w12 (kernels.TopKOneW12).
	if os.Getenv("TILERT_GPU_TOPK_W12") == "0" {
		kernels.TopKOneW12 = false
	}
}

// mlaWGRule: the launches mla_decode_wg2 takes by default (above).
func mlaWGRule(mode string, nq, H int) bool {
	switch mode {
	case "0":
		return false
	case "1":
		return H > 0
	}
	return H >= 64
}

// mlaWGLaunches counts the decode launches on mla_decode_wg2 (tests: no
// silent fallback).
var mlaWGLaunches atomic.Int64

var mlaWGOnce sync.Once

// mlaWGOK: mla_decode_wg2 takes this launch (mlaWGRule, and the sm_90a
// module loaded).
func (b *cudaDevice) mlaWGOK(nq, H int) bool {
	if !mlaWGRule(mlaWG, nq, H) {
		return false
	}
	err := b.k.WGSupported()
	mlaWGOnce.Do(func() {
		if err != nil {
			slog.Warn("mla_decode_wg2 is unavailable (needs sm_90a: an H100/H200 and NVRTC 12+); the decode step's MLA runs on mla_decode_tcf2", "err", err)
			return
		}
		slog.Info("the decode step's sparse MLA on mla_decode_wg2 (sm_90a module, wgmma, one fp16 part; TILERT_GPU_MLA_WG=0 goes back to mla_decode_tcf2)")
	})
	return err == nil
}

// mlaPrefillWGOK says whether TILERT_GPU_MLA_PREFILL=5's mla_prefill_wg
// (or =6's mla_prefill_wg2) runs here: the sm_90a module (compute
// capability 9.0, NVRTC 12+) loads. Otherwise =5 / =6 run mla_prefill_h1
// (=4), said once in the log.
func (b *cudaDevice) mlaPrefillWGOK(mode int) bool {
	err := b.k.WGSupported()
	wgOnce.Do(func() {
		name := "mla_prefill_wg"
		if mode == 6 {
			name = "mla_prefill_wg2"
		}
		if err != nil {
			slog.Warn(fmt.Sprintf("MLA prefill mode %d: %s is unavailable (needs sm_90a: an H100/H200 and NVRTC 12+); running mla_prefill_h1 (=4) instead", mode, name), "err", err)
			return
		}
		slog.Info(fmt.Sprintf("MLA prefill mode %d: %s (sm_90a module, wgmma) runs the MLA prefill", mode, name))
	})
	return err == nil
}

func (b *cudaDevice) mlaDecodeRows(out, qn, qp cuda.DevPtr, cacheOff int64, rowBase, indices, lens, ws cuda.DevPtr, nq, H, nidx, ldIdx int, scale float32) error {
	if ws != 0 && b.mlaFewOK(nq, H) {
		fewMLALaunches.Add(1)
		return b.k.MLADecodeFew(b.s, out, 0, qn, qp, cuda.DevPtr(cacheOff), 0, rowBase, indices, lens, ws, nq, H, nidx, ldIdx, scale)
	}
	if ws != 0 && b.mlaWGOK(nq, H) {
		mlaWGLaunches.Add(1)
		return b.k.MLADecodeWG2(b.s, out, 0, qn, qp, cuda.DevPtr(cacheOff), 0, rowBase, indices, lens, ws, nq, H, nidx, ldIdx, b.k.MLAWG2Splits(nq, H, nidx), scale)
	}
	if mlaTCF != "" && b.c.Info().CCMajor >= 9 {
		return b.mlaDecodeTCF(out, qn, qp, cuda.DevPtr(cacheOff), rowBase, indices, lens, ws, nq, H, nidx, ldIdx, scale)
	}
	ns := b.k.MLATCSplits(nq, H, nidx)
	return b.k.MLADecodeTCPRows(b.s, out, 0, qn, qp, cacheOff, rowBase, indices, lens, ws, nq, H, nidx, ldIdx, ns, scale)
}

func (b *cudaDevice) indexerScoresQRows(out, qh, wq cuda.DevPtr, cacheOff int64, rowBase, lens, hist cuda.DevPtr, nq, T, ldOut int) error {
	if b.idxWGHOK(nq, T) {
		if idxWGHPair(idxWGH, nq, T) {
			return b.k.IndexerScoresWGH2Rows(b.s, out, qh, wq, cacheOff, rowBase, lens, hist, nq, T, ldOut)
		}
		return b.k.IndexerScoresWGHRows(b.s, out, qh, wq, cacheOff, rowBase, lens, hist, nq, T, ldOut)
	}
	return b.k.IndexerScoresMMARows(b.s, out, qh, wq, cacheOff, rowBase, lens, hist, nq, T, ldOut)
}

// mlaTCF: the fp8 MLA decode runs on mla_decode_tcf (fp16 fragments
// straight from the raw fp8 tiles) split over the SMs with the combine. The
// default is =2 (two fp16 parts of the queries and probabilities: float32
// rounding apart from tc): on the H200 (docs/measured/h200-2026-12-02)
// 128 heads x 2048 tokens take 18.7 us with the combine against tc's 24.1,
// and the whole gpu-check passed with it. =1 or =3 three parts
// (float32-exact products), =8 two parts with 8 warps per head group; =0
// runs mla_decode_tc, as does asking for another variant
// (TILERT_GPU_MLA_TCP). =q (tcf merged inside a cluster) and
// TILERT_GPU_MLA_TCQ were removed in session 12, TILERT_GPU_MLA_TC32 in
// session 55 (removed.go).
var mlaTCF = tcfSwitch(os.Getenv("TILERT_GPU_MLA_TCF"), os.Getenv("TILERT_GPU_MLA_TCP") == "1")

func tcfSwitch(v string, other bool) string {
	switch {
	case v == "0":
		return ""
	case v != "":
		return v
	case other:
		return ""
	}
	return "2"
}

// mlaDecodeTCF runs mla_decode_tcf as mlaTCF says; rowBase != 0: rows of
// several slots (cache then the layer's offset).
func (b *cudaDevice) mlaDecodeTCF(out, qn, qp, cache, rowBase, indices, lens, ws cuda.DevPtr, nq, H, nidx, ldIdx int, scale float32) error {
	v := kernels.MLATCF2
	switch mlaTCF {
	case "1", "3":
		v = kernels.MLATCF3
	case "8":
		v = kernels.MLATCF8
	}
	return b.k.MLADecodeTCF(b.s, v, out, 0, qn, qp, cache, 0, rowBase, indices, lens, ws, nq, H, nidx, ldIdx, b.k.MLATCSplits(nq, H, nidx), scale)
}

// slotMergeOn: the indexer scores, the top-k and the fp8 MLA decode run
// once for the rows of all slots (per-row cache bases in the step's
// metadata) instead of once per slot; TILERT_GPU_SLOT_MERGE=0 goes back to a
// launch per slot. On the H200 with tcf2 (docs/measured/h200-2026-12-02):
// 4 slots at 8192 7.17 -> 6.36 ms, and the whole gpu-check passed.
var slotMergeOn = os.Getenv("TILERT_GPU_SLOT_MERGE") != "0"

// epiRowsOn: with the slot merge, the attention epilogue runs once for
// all rows (attn_epilogue_rows); TILERT_GPU_EPI_ROWS=0 keeps a launch per
// slot with the other merged launches (to time the one against the other).
var epiRowsOn = os.Getenv("TILERT_GPU_EPI_ROWS") != "0"

// moeNormOn: a MoE layer whose routed and shared experts moeTile runs in
// one round (M <= MaxTileM rows) ends with one launch, the combine fused
// with the next norm's residual add and RMSNorm
// (kernels.MoECombineNorm; bit-identical to the two launches, which
// cost ~5.5 us a layer in the H200 profile); TILERT_GPU_MOE_NORM_FUSED=0
// keeps moeCombineSlots then addRMSNorm.
var moeNormOn = os.Getenv("TILERT_GPU_MOE_NORM_FUSED") != "0"

// mlaPrefillOn: TILERT_GPU_MLA_PREFILL runs the fp8 MLA of a slot's group
// of at least mlaPrefillMinRows rows (a prefill chunk) on mlaPrefill
// instead of mlaDecode (mla_decode_tc): =1 mla_prefill_tc (32 heads a
// block: no faster than mla_decode_tc on the H200, 3.74 ms for 256 rows),
// =2 mla_prefill_tcp, =3 mla_prefill_tcpi (tcp with the tile converted by
// integer operations: the same bits), =4 mla_prefill_h1 (one fp16 part of
// the queries, entries and probabilities: serving-mode accuracy, ~2^-11
// relative, not float32-exact; sm_89+, else tcp), =5 mla_prefill_wg
// (=4's function and roundings on Hopper's wgmma, its own sm_90a module;
// elsewhere, or where NVRTC cannot build sm_90a, it runs =4 and says so in
// the log), =6 mla_prefill_wg2 (=5's arithmetic, the same bits, with a
// producer warpgroup filling a second fp16 stage while the MMAs run; the
// same sm_90a rule and fallback); the emulator transcribes all three as
// mlaPrefillH1. Exact mode never runs
// any of them (its caches are not fp8_ds_mla: forward.go takes this path
// only for e.mla == mlaFP8). =2 is the default (=0 goes back to
// mla_decode_tc): the whole gpu-check passed with it and the GEMMs on
// (docs/measured/h200-2026-12-02-s7). On the H200 an 8192-token prefill
// with the GEMMs and absorb_tc takes 447 ms with =2 and 168 ms with =4 and
// one-part GEMMs (TILERT_GPU_GEMM_SPLITS=1; both serving-mode opt-ins).
var mlaPrefillOn = mlaPrefillMode != 0

var mlaPrefillMode = func() int {
	switch os.Getenv("TILERT_GPU_MLA_PREFILL") {
	case "0":
		return 0
	case "1":
		return 1
	case "2":
		return 2
	case "3":
		return 3
	case "4":
		return 4
	case "5":
		return 5
	case "6":
		return 6
	}
	return 2
}()

// mlaPrefillModeSet: TILERT_GPU_MLA_PREFILL is set, so it wins over the
// fast prefill's choice (comparisons).
var mlaPrefillModeSet = os.Getenv("TILERT_GPU_MLA_PREFILL") != ""

// prefillMLAMode is the MLA prefill mode of a forward whose GEMMs take
// parts parts of x (0: off, mlaDecode runs the rows): with the fast prefill
// (engine.PrefillFast, one part) mla_prefill_wg2, the fastest kernel of
// the one-part roundings (it runs mla_prefill_h1 where the sm_90a module
// cannot load), unless the environment names a mode.
func (e *backend) prefillMLAMode(parts int) int {
	if !mlaPrefillOn {
		return 0
	}
	if parts == 1 && e.fastPrefill() && !mlaPrefillModeSet {
		return 6
	}
	return mlaPrefillMode
}

// mlaPrefillMinRows: from 16 rows of 128 heads the unsplit launch has
// 64+ blocks per 16 rows, enough to fill the SMs at prefill's 256 rows.
const mlaPrefillMinRows = 16

var (
	mlaHeadsOn = os.Getenv("TILERT_GPU_MLA_HEADS") != "0"
	mlaTCOn    = os.Getenv("TILERT_GPU_MLA_TC") != "0"
	// mlaTCPOn: TILERT_GPU_MLA_TCP=1 runs mla_decode_tcp (the same bits as
	// mla_decode_tc; query fragments in registers, 3 tiles in flight).
	mlaTCPOn = os.Getenv("TILERT_GPU_MLA_TCP") == "1"
	// absorbWideOn: TILERT_GPU_ABSORB_WIDE=0 keeps the one-block-per-head
	// absorb kernels for fp8 W_UK / W_UV (comparisons).
	absorbWideOn = os.Getenv("TILERT_GPU_ABSORB_WIDE") != "0"
)

// topkWideOn: TILERT_GPU_TOPK_WIDE=0 keeps one block per row for the
// indexer's top-k and the one-load-per-FMA indexer scores at long contexts
// (comparisons; below kernels.TopKWideMinT keys they are always used).
var topkWideOn = os.Getenv("TILERT_GPU_TOPK_WIDE") != "0"

// topkRadixOn: TILERT_GPU_TOPK_RADIX=0 turns the three-launch radix top-k
// off (then TILERT_GPU_TOPK_WIDE decides as before). The H200 run of
// docs/measured/h200-2026-12-01-indexer measured it faster at every context.
var topkRadixOn = os.Getenv("TILERT_GPU_TOPK_RADIX") != "0"

// topkRadixFinal: TILERT_GPU_TOPK_LIST=0 keeps the radix top-k's final
// stage on the candidate bitmaps (topk_radix_mark_s) instead of the
// candidate list and second-level histogram (topk_radix_mark_l).
// Rows of up to kernels.TopKRadixOneMaxT keys are selected in one block
// each (topk_radix_one_w since session 22: no mark blocks, no ticket; H200,
// graph-timed, the scores + top-k pair at 8192 keys 14.7 us against 17.8
// for the list with its first kernel, docs/measured/h200-2026-12-01-attn);
// TILERT_GPU_TOPK_ONE=0 keeps the list (or the bitmaps) there too. =v1,
// that first kernel (topk_radix_one), is refused (removed.go).
var topkRadixFinal = func() kernels.TopKRadixFinal {
	if os.Getenv("TILERT_GPU_TOPK_LIST") == "0" {
		return kernels.TopKRadixBitmaps
	}
	if os.Getenv("TILERT_GPU_TOPK_ONE") == "0" {
		return kernels.TopKRadixList
	}
	return kernels.TopKRadixOne
}()

// idxMMAOn: TILERT_GPU_IDX_MMA=0 keeps the serving indexer on RoPE,
// quantisation and scaling as three launches and the float score kernels
// instead of indexerQPrep and the tensor-core indexerScoresQ.
var idxMMAOn = os.Getenv("TILERT_GPU_IDX_MMA") != "0"

func (b *cudaDevice) argmax(out, x, scratch cuda.DevPtr, rows, n, ld int) error {
	if scratch != 0 {
		return b.k.ArgmaxWide(b.s, out, 0, x, scratch, rows, n, ld)
	}
	return b.k.Argmax(b.s, out, 0, x, rows, n, ld)
}

// sampleOne: TILERT_GPU_SAMPLE_WIDE=0 keeps the one-block sampler
// (sample_rows, its counter an argument, so sampled steps run eagerly)
// instead of kernels.SampleWide, whose counter is on the device. The
// default since session 37 (one H100, docs/measured/h100-2026-12-05-s37):
// the pick at T 0.6 / top-p 0.95 44-48 us in a graph against sample_rows'
// 449-666 us, the sampled step 1.78 ms against 2.46 (greedy 1.73),
// DeepSeek-V3.2 dims, 3 MoE layers, 8192.
var sampleOne = os.Getenv("TILERT_GPU_SAMPLE_WIDE") == "0"

func (b *cudaDevice) sample(out, logits, scratch cuda.DevPtr, n int, p kernels.SamplingParams) error {
	if scratch != 0 && !sampleOne {
		return b.k.SampleWide(b.s, out, logits, scratch, 1, n, n, p)
	}
	return b.k.Sample(b.s, out, logits, 1, n, n, p)
}

func (b *cudaDevice) adjustLogits(x, entries cuda.DevPtr, n, ld int) error {
	return b.k.AdjustLogits(b.s, x, entries, n, ld)
}

func (b *cudaDevice) logprobs(x, tok, lp, topID, topLP cuda.DevPtr, rows, n, ld, k int) error {
	return b.k.Logprobs(b.s, x, tok, lp, topID, topLP, rows, n, ld, k)
}

func (b *cudaDevice) mlaCacheWrite(kind mlaKind, cache, src, pos cuda.DevPtr, n, ld int) error {
	switch kind {
	case mlaF32:
		return b.k.EngMLACacheWriteF32(b.s, cache, src, pos, n, ld)
	case mlaBF16:
		return b.k.EngMLACacheWriteBF16(b.s, cache, src, pos, n, ld)
	}
	return b.k.EngMLACacheWrite(b.s, cache, src, pos, n, ld)
}

func (b *cudaDevice) idxCacheWrite(f32 bool, cache, src, pos cuda.DevPtr, n, ld int) error {
	if f32 {
		return b.k.EngIndexerCacheWriteF32(b.s, cache, src, pos, n, ld)
	}
	return b.k.EngIndexerCacheWrite(b.s, cache, src, pos, n, ld)
}

func (b *cudaDevice) quantUE8M0(x cuda.DevPtr, n int) error { return b.k.EngQuantUE8M0(b.s, x, n) }

func (b *cudaDevice) copy2D(dst, src cuda.DevPtr, rows, cols, ldd, lds int) error {
	return b.k.EngCopy2D(b.s, dst, src, rows, cols, ldd, lds)
}

func (b *cudaDevice) scale(x cuda.DevPtr, a float32, n int) error { return b.k.EngScale(b.s, x, a, n) }

// absorbQ over fp8 W_UK runs spread over all SMs (and copies q's RoPE part
// in the same launch); float32 weights (exact mode) keep the per-head kernel.
func (b *cudaDevice) absorbQ(out, qpe, q, w, s cuda.DevPtr, fp8 bool, M, H, nope, R, ldq, hs, P int, rope kernels.QRope, qs kernels.QScale) error {
	if qs.On() {
		// The forward asked qaLate first: only the one-row kernels scale.
		if !b.absorbFastQ(fp8, M, nope, R, hs, P, qpe != 0) {
			return errors.AssertionFailedf("gpu: absorb q with RMSNorm's scale needs the one-row absorb_q_fast (M=%d nope=%d R=%d hs=%d P=%d)", M, nope, R, hs, P)
		}
		return b.k.AbsorbQFastScaled(b.s, out, qpe, q, w, s, H, nope, R, hs, P, rope, qs)
	}
	if b.absorbMany(fp8, w, M, R) { // prefill rows on tensor cores (gemm.go)
		return b.absorbQTC(out, qpe, q, w, s, M, H, nope, R, ldq, hs, P, rope)
	}
	if b.absorbFastQ(fp8, M, nope, R, hs, P, qpe != 0) { // one row (absorb_fast.go)
		return b.k.AbsorbQFast(b.s, out, qpe, q, w, s, H, nope, R, hs, P, rope)
	}
	if fp8 && absorbWideOn && nope <= 256 && R%32 == 0 && P%2 == 0 {
		return b.k.AbsorbQFP8(b.s, out, qpe, q, w, s, M, H, nope, R, ldq, hs, P, rope)
	}
	if err := b.k.EngAbsorbQ(b.s, out, q, w, s, fp8, M, H, nope, R, ldq, hs); err != nil || qpe == 0 {
		return err
	}
	return b.qpeOut(qpe, q, M, H, nope, ldq, hs, P, rope)
}

// qpeOut copies q's RoPE part (P values after nope in each head of hs) out
// to qpe [M][H][P] and rotates it, for the absorb products that leave it.
func (b *cudaDevice) qpeOut(qpe, q cuda.DevPtr, M, H, nope, ldq, hs, P int, rope kernels.QRope) error {
	if ldq == H*hs { // the rows' heads are evenly strided: one copy
		if err := b.k.EngCopy2D(b.s, qpe, q.Add(int64(4*nope)), M*H, P, P, hs); err != nil {
			return err
		}
	} else {
		for m := 0; m < M; m++ {
			if err := b.k.EngCopy2D(b.s, qpe.Add(int64(4*m*H*P)), q.Add(int64(4*(m*ldq+nope))), H, P, P, hs); err != nil {
				return err
			}
		}
	}
	if rope.Pos == 0 {
		return nil
	}
	return b.rope(qpe, rope.Pos, rope.Cos, rope.Sin, M*H, H, P, 0, P, rope.Interleaved)
}

func (b *cudaDevice) absorbV(out, x, w, s cuda.DevPtr, fp8 bool, M, H, vd, R, ldo int) error {
	if b.absorbMany(fp8, w, M, R) { // prefill rows on tensor cores (gemm.go)
		return b.k.AbsorbVTC(b.s, out, x, w, s, M, H, vd, R, ldo)
	}
	if b.absorbFastV(fp8, M, R) { // one row (absorb_fast.go)
		return b.k.AbsorbVFast(b.s, out, x, w, s, H, vd, R, absorbFastRW)
	}
	if fp8 && absorbWideOn && R == kernels.MLALatentDim {
		return b.k.AbsorbVFP8(b.s, out, x, w, s, M, H, vd, R, ldo)
	}
	return b.k.EngAbsorbV(b.s, out, x, w, s, fp8, M, H, vd, R, ldo)
}

func (b *cudaDevice) attnEpilogue(a kernels.AttnEpilogue) error { return b.k.AttnEpilogue(b.s, a) }

// embedCheckOn: embed_bf16_checked writes a NaN row for an id outside the
// vocabulary instead of reading outside the table. It matters for the
// pipelined step (ahead.go, on by default): a pick over non-finite logits
// (arg-max 0x7fffffff) reaches the next forward on the device before the
// host refuses it, and the plain kernel's read would fault the context
// for every slot. One compare per row; checked on the H200 against its CPU
// reference and in the pipelined engine tests (docs/measured/
// h200-2026-12-01-s4-round2/async). TILERT_GPU_EMBED_CHECK=0 takes the
// unchecked kernel.
var embedCheckOn = os.Getenv("TILERT_GPU_EMBED_CHECK") != "0"

// fuseOn: the attention side's per-row work after the projections runs as
// one attnEpilogue launch per group (on the H200 3.2 us per layer in a
// graph against 14.4 us for the 7 launches it replaces,
// docs/measured/h200-2026-12-01-post). TILERT_GPU_FUSE=0 keeps the unfused
// launches (comparisons). Its =2 and =3 (the router GEMV with the routing,
// the MoE combine with the closing norm) were removed in session 15 and
// are refused (removed.go).
var fuseOn = os.Getenv("TILERT_GPU_FUSE") != "0"

// runner executes engine work on a backend: the GPU's device thread or the
// emulator.
type runner interface {
	run(f func(b device) error) error
	// runAhead is run, except that when f returns true the work it queued
	// is left in flight (no final sync; the next run's work queues behind
	// it): a pipelined step (ahead.go).
	runAhead(f func(b device) (bool, error)) error
	close() error
}

type cudaRunner struct {
	dev  *cuda.Device
	own  bool
	info cuda.DeviceInfo
	// stream, when set, is this runner's own stream on dev (ranks of a
	// sharded engine on one GPU, one stream each: shard.go); else the
	// context's.
	stream    cuda.Stream
	ownStream bool        // close destroys it
	prio      prioMode    // TILERT_GPU_MAIN_PRIO resolved (prioPin)
	prioHi    int         // the device's greatest priority, where prio is not off
	ev        cuda.Event  // downloadAsync's event (0: none yet)
	cp        copyStreams // the pipelined step's copy streams (aheadCopyOn)
	// gemmWS: the one-part GEMM's scratch for this runner's stream
	// (gemm.go allocGemmScratch), handed to every run's cudaDevice.
	gemmWS      cuda.DevPtr
	gemmWSBytes int64
	side        sideStream // the second stream of a step's forks (side.go)
	// wgMode: the MLA prefill mode of this runner's engine when it is a
	// wgmma one (5 or 6; newBackend), whose module loads before any capture.
	wgMode int
	// clk, when set, times the runs' device work (ClockPrefill, clock.go).
	clk *devClock
	// pdlSet: the engine's launch kind was given to the context's kernels
	// (enginePDL).
	pdlSet bool
	// oproj: o_proj's shape, pinned to TILERT_GPU_OPROJ's or SpreadPlan's
	// plan (oproj.go; zero: not pinned); oprojPlan that plan, worked out at
	// the first run (oprojOK) rather than at every step.
	oproj     [2]int
	oprojPlan kernels.TilePlan
	oprojOK   bool
	// qb: q_b's shape (sidePin; zero: none), whose one-row launch variant
	// (qbVariant, worked out at the first run) decides whether the q chain
	// is capped by default.
	qb          [2]int
	qbVariant   string
	qbVariantOK bool
	// wqb: the indexer wq_b's shape, pinned to the staged GEMV (wqb.go;
	// zero: not pinned), set before TILERT_GPU_TILE_PLANS's pins.
	wqb [2]int
	// plans: TILERT_GPU_TILE_PLANS's pins (tileplans.go), set at every run
	// after o_proj's.
	plans map[[2]int]kernels.TilePlan
}

// enginePDL: the engine launches its listed kernels programmatically (PDL)
// unless TILERT_GPU_PDL=0. The kernels package launches plainly unless
// TILERT_GPU_PDL=1 (its callers' default); the decode step with its side
// streams runs faster with them (side.go: 2.844 against 2.895 ms, 2.764
// with the side GEMVs capped, docs/measured/h200-2026-12-02-s11 call C).
// Programmatic launches only schedule: every kernel waits for its
// predecessor before it reads or writes (cuda/kernels pdl.go), so the
// outputs keep their bits.
var enginePDL = os.Getenv("TILERT_GPU_PDL") != "0"

// readyModules compiles and loads the modules beside the default one that
// the switches use, on the device thread before any graph capture (a
// capture cannot load a module). After the first run each is a lookup of
// the context's loaded module; tests flip the switches in-process, so it
// is asked at every run.
func (r *cudaRunner) readyModules(b *cudaDevice) {
	if !r.pdlSet {
		r.pdlSet = true
		if enginePDL && !b.k.PDL() {
			b.k.SetPDL(true)
		}
	}
	if r.wgMode != 0 {
		b.mlaPrefillWGOK(r.wgMode) // the sm_90a module
	}
	if r.oproj != [2]int{} {
		if !r.oprojOK {
			r.oprojPlan, r.oprojOK = oprojFor(b.k, r.oproj), true
		}
		b.k.SetTilePlan(r.oproj[0], r.oproj[1], r.oprojPlan)
	}
	if r.wqb != [2]int{} && b.k.StageFits(r.wqb[0], r.wqb[1]) {
		b.k.SetTilePlan(r.wqb[0], r.wqb[1], wqbStagePlan)
	}
	for shape, p := range r.plans {
		b.k.SetTilePlan(shape[0], shape[1], p)
	}
	if !r.qbVariantOK {
		v := ""
		if r.qb != [2]int{} {
			v = b.k.TileVariantOf(r.qb[0], r.qb[1])
		}
		r.qbVariant, r.qbVariantOK = v, true
		if r.qb != [2]int{} && (sideQOn || sideShOn) {
			raised, plain := sideOpen(v, qUncapped(r.prio, true)), sideOpen(v, false)
			slog.Info("side streams: tile GEMV caps (blocks an SM, 0: uncapped; TILERT_GPU_SIDE_CAP)",
				"q_chain_1row_raised", sideCapFor(chainQ, b.k.PDL(), raised, 1), "q_chain_1row", sideCapFor(chainQ, b.k.PDL(), plain, 1),
				"q_chain_rows", sideCapFor(chainQ, b.k.PDL(), plain, 2),
				"q_chain_late_1row", sideCapFor(chainQLate, b.k.PDL(), plain, 1),
				"shared_expert", sideCapFor(chainSh, b.k.PDL(), plain, 1),
				"q_b", fmt.Sprintf("%dx%d%s", r.qb[0], r.qb[1], v), "q_fork_at", cmp.Or(sideQAt, "auto"),
				"launch_prio", r.prio)
		}
	}
	b.qbVariant = r.qbVariant
	if mlaFewOn || topkFastOn {
		b.fewReady()
	}
	if gemvMidMode != "" {
		b.gemvMidReady()
	}
	if absorbFastOn {
		b.absorbFastReady()
	}
	weightLoadsOnce.Do(func() {
		pair, down := b.k.ExpertShapes()
		slog.Info("weight loads: L2 policy (TILERT_GPU_L2_EVICT), a single row's routed-expert shapes (TILERT_GPU_EXPERT_SHAPE) and dense 1536-byte rows (TILERT_GPU_WHOLE_CHUNKS)",
			"evict_first", kernels.EvictFirst, "grouped_gemv_normal", kernels.EvictFirst && kernels.GroupNormal,
			"card", b.c.Info().Name, "gate_up", pair, "down", down,
			"whole_chunks", kernels.OneRowWholeChunks)
	})
}

// weightLoadsOnce: readyModules states the weight loads' L2 policy and the
// routed experts' shapes once a process (bench rows then carry them).
var weightLoadsOnce sync.Once

func (r *cudaRunner) run(f func(b device) error) error {
	return r.runAhead(func(b device) (bool, error) { return false, f(b) })
}

func (r *cudaRunner) runAhead(f func(b device) (bool, error)) error {
	return r.dev.Do(func(c *cuda.Ctx) error {
		k, err := kernels.Load(c)
		if err != nil {
			return err
		}
		b := &cudaDevice{c: c, k: k, s: c.Stream(), ev: &r.ev, cp: &r.cp, gemmWS: r.gemmWS, gemmWSBytes: r.gemmWSBytes, side: &r.side}
		r.readyModules(b)
		if r.stream != 0 {
			b.s = r.stream
		}
		b.prio, b.prioHi = r.prio, r.prioHi
		if r.clk != nil {
			b.clk = r.clk
			r.clk.bind(c, b.s)
			prev := c.SetQueueHook(r.clk.touch)
			defer func() { c.SetQueueHook(prev) }() // the hook this one replaced
		}
		ahead, err := f(b)
		err = errors.CombineErrors(err, b.settle())
		b.k.SetPriority(0) // the Set is the context's: the next run starts at the stream's
		b.cut()            // before the closing sync, or with work left ahead
		if err != nil {
			// Let queued work finish before the caller looks at anything.
			return errors.CombineErrors(err, c.SyncStream(b.s))
		}
		if ahead {
			return nil
		}
		return c.SyncStream(b.s)
	})
}

func (r *cudaRunner) close() error {
	if r.side.s != 0 {
		if err := r.dev.Do(func(c *cuda.Ctx) error { return r.side.destroy(c) }); err != nil {
			return err
		}
	}
	if r.cp.up != 0 {
		if err := r.dev.Do(func(c *cuda.Ctx) error { return r.cp.destroy(c) }); err != nil {
			return err
		}
	}
	if r.ev != 0 {
		ev := r.ev
		r.ev = 0
		if err := r.dev.Do(func(c *cuda.Ctx) error { return c.DestroyEvent(ev) }); err != nil {
			return err
		}
	}
	if r.stream != 0 && r.ownStream {
		s := r.stream
		r.stream = 0
		if err := r.dev.Do(func(c *cuda.Ctx) error { return c.DestroyStream(s) }); err != nil {
			return err
		}
	}
	if r.own {
		return r.dev.Close()
	}
	return nil
}

// mlaFewOn: TILERT_GPU_MLA_FEW=1 runs the fp8 MLA decode of up to
// kernels.MLAFewMaxHeads heads (a TP-8 shard's 16 or 8) on mla_decode_few
// (cu/few/mla_few.cu: 8 heads x 16 tokens a block, the tokens split over
// many blocks, mla_combine_few) instead of mla_decode_tcf2 (one 32-token
// tile of 16 heads a block: 64 blocks for 16 heads x 2048 tokens). Same
// results to float32 rounding (float32 products). Needs sm_90 and the
// few-heads module (kernels_few.go); otherwise the default path runs, said
// once in the log. More heads keep the default path.
// On by default since session 9 (the whole gpu-check passed with it, the
// TP-8 shard's rank 0 faster: 113.1 -> 109.7 us with the two switches
// below); TILERT_GPU_MLA_FEW=0 goes back to tcf2.
var mlaFewOn = os.Getenv("TILERT_GPU_MLA_FEW") != "0"

// topkFastOn: TILERT_GPU_TOPK_FAST=1 runs the indexer's top-k of rows up to
// kernels.TopKFastMaxT keys on topk_fast (cu/few/topk_fast.cu:
// the one-block top-k's selection, element for element, with 512 threads
// and warp-0 block scans) instead of topk_radix_one_w (whatever
// TILERT_GPU_TOPK_ONE / _LIST say); longer rows keep the default path.
// topk_fast is on by default since session 9 (=0 goes back to
// topk_radix_one_w). =2 (the scores and the selection in one launch,
// indexer_scores_topk) was removed in session 12, measured slower
// (removed.go).
var topkFastOn = os.Getenv("TILERT_GPU_TOPK_FAST") != "0"

var (
	// fewOnce: the few-heads module's availability is logged once.
	fewOnce sync.Once
	// fewMLALaunches / fastTopKLaunches count the engine's launches of
	// mla_decode_few and topk_fast (tests: the switch did not fall back).
	fewMLALaunches   atomic.Int64
	fastTopKLaunches atomic.Int64
)

// fewReady loads the few-heads module (before any graph capture) and says
// whether it is there.
func (b *cudaDevice) fewReady() bool {
	err := b.k.FewSupported()
	fewOnce.Do(func() {
		if err != nil {
			slog.Warn("TILERT_GPU_MLA_FEW / TILERT_GPU_TOPK_FAST: the few-heads kernels are unavailable (need sm_90); running the default kernels", "err", err)
			return
		}
		slog.Info("few-heads kernels loaded", "mla_few", mlaFewOn, "topk_fast", topkFastOn)
	})
	return err == nil
}

// mlaFewOK: mla_decode_few takes this decode of nq rows of H heads: one
// row of at most mlaFewBestHeads heads, where it measured faster than tcf2
// (H200, session 9, graph-timed with the combine: 16 heads 9.54 against
// 11.42 us, 8 heads 7.55 against 10.84); 32 heads (16.75 against 12.38) and
// 4 rows of 16 (25.87 against 15.72) keep tcf2.
func (b *cudaDevice) mlaFewOK(nq, H int) bool {
	return mlaFewOn && nq == 1 && H <= min(mlaFewBestHeads, kernels.MLAFewMaxHeads) && b.c.Info().CCMajor >= 9 && b.fewReady()
}

// mlaFewBestHeads is the most heads mla_decode_few takes in the engine.
const mlaFewBestHeads = 16

// topkFastOK: topk_fast takes this top-k of T keys: rows of at most
// topkFastBestT keys, where it measured faster than topk_radix_one (H200,
// session 9, scores + selection graph-timed at 8192 keys: 13.05 against
// 14.91 us for 1 row, 14.31 against 16.23 for 4); at 16384 keys it was
// slower (22.43 against 20.68). Those figures are against the one-block
// top-k's first kernel (removed in session 22), not topk_radix_one_w.
func (b *cudaDevice) topkFastOK(T, K int) bool {
	return topkFastOn && T <= min(topkFastBestT, kernels.TopKFastMaxT) && K <= 32767 && b.c.Info().CCMajor >= 9 && b.fewReady()
}

// topkFastBestT is the longest row topk_fast takes in the engine.
const topkFastBestT = 8192
