package gpu

import (
	"encoding/binary"
	"math"
	"os"
	"strconv"

	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/cuda"
	"github.com/tilert-go/tilert/cuda/kernels"
	"github.com/tilert-go/tilert/engine"
	"github.com/tilert-go/tilert/model"
)

// Prefill's matrix work: with many rows (a prompt chunk) the linear layers
// run as tensor-core GEMMs (kernels.GemmFP8/GemmBF16) instead of GEMVs of 4
// rows, and a MoE layer sorts its (row, expert) pairs by expert on the host
// and runs every routed expert's rows as one grouped GEMM
// (kernels.GemmFP8Experts). x is split into 3 bf16 parts by default, so the
// products are float32's and exact mode keeps its float32 numerics;
// TILERT_GPU_GEMM_SPLITS=2 trades 8 bits of x for a third less tensor work,
// and TILERT_GPU_GEMM_SPLITS=1 rounds x once (serving-mode prefill as HF and
// vLLM run it in bf16: the fp8 GEMMs on gemm_p1.cu, fp16 x with a
// power-of-two row scale, 4-stage cp.async, ~3x less tensor work than 3
// parts). Exact mode keeps 3 parts whatever the switch says (gemmParts).
//
// On by default (TILERT_GPU_GEMM=0 goes back to 4-row GEMVs over chunks of
// 32 rows): the whole gpu-check passed with it, absorb_tc and
// mla_prefill_tcp as the defaults (docs/measured/h200-2026-12-02-s7); an
// 8192-token prefill of one dense + one MoE layer takes 447 ms, where the
// GEMVs did not finish within 40 s.
// TILERT_GPU_PREFILL_CHUNK sets the rows per prefill forward (default
// defaultChunkLen with the GEMMs, 32 without). Larger chunks should pay
// (not yet measured): every chunk streams all 256 experts' weights through
// the grouped GEMM once (at 256 rows a chunk that was a third of an
// 8192-token prefill on the H200, docs/measured/h200-2026-12-01-pfill/run1),
// and the narrow projections fill the SMs only with many rows. The
// workspace grows with it: at DeepSeek-V3.2 dims about 5 GB for 2048 rows
// (7.5 GB with max_seq_len 131072: the indexer's scores and top-k scratch
// are rows x max_seq_len).

// gemmDevice is the GEMM part of device.
type gemmDevice interface {
	// gemmFP8 and gemmBF16 compute what gemvFP8/gemvBF16 do, for any M,
	// with x in parts bf16 parts (3: float32-exact products; 1: x rounded
	// once, serving mode only: backend.gemmParts).
	gemmFP8(y, x, w, scale cuda.DevPtr, N, K, M, ldx, ldy, parts int) error
	gemmBF16(y, x, w cuda.DevPtr, N, K, M, ldx, ldy, parts int) error
	// gemmExperts is kernels.GemmFP8Experts: tiles [ntiles][3] (expert,
	// first pair, pairs), xrows [pairs], y [pairs][N].
	// xRows is how many rows x has (the one-part split rounds them
	// once).
	// The first nbig tiles hold up to kernels.GemmExpertBigRows pairs
	// (kernels.ExpertTiles; only with the one-part kernels).
	gemmExperts(y, x cuda.DevPtr, ldx, xRows int, wTable, sTable, tiles, xrows cuda.DevPtr, ntiles, nbig, N, K, parts int) error
	// moeCombineRows is kernels.MoECombineRows.
	moeCombineRows(out, ey, wts, pos cuda.DevPtr, rows, k, N int) error
	// absorbQP1 / absorbVP1 are absorbQ / absorbV over fp8 weights with x
	// rounded once (serving-mode prefill with one part: absorb_p1.go).
	absorbQP1(out, qpe, q, w, s cuda.DevPtr, M, H, nope, R, ldq, hs, P int, rope kernels.QRope) error
	absorbVP1(out, x, w, s cuda.DevPtr, M, H, vd, R, ldo int) error
}

const (
	gemmMinRows     = 16  // below, the GEMVs (helper-tuned for 1..8 rows) stay
	defaultChunkLen = 256 // prefill rows per forward with the GEMMs on (capped by max_seq_len; pickChunk)
	oldChunkLen     = 32
	maxChunkLen     = 8192
)

var (
	gemmOn = os.Getenv("TILERT_GPU_GEMM") != "0"
	// gemmSplits: TILERT_GPU_GEMM_SPLITS, the parts of x in serving mode's
	// GEMMs (3 default, 2, or 1: x rounded once, as HF's and vLLM's bf16
	// prefill; the fp8 GEMMs then run gemm_p1.cu, fp16 x with a
	// power-of-two scale per row, the bf16 ones gemm_tc's one-part
	// kernels). Exact mode ignores it (gemmParts).
	gemmSplits = envInt("TILERT_GPU_GEMM_SPLITS", 3)
	// gemmSplitsSet: the variable is set, so it wins over the fast
	// prefill's one part (comparisons).
	gemmSplitsSet = os.Getenv("TILERT_GPU_GEMM_SPLITS") != ""
	// expertBMEnv: TILERT_GPU_EXPERT_BM as set (0 unset); with one part
	// the grouped experts run tiles of 64 pairs unless it says 128 (on the
	// H200 64-pair tiles were faster: gate/up 8.06 against 8.76 ms, down
	// 8.46 against 9.23 at 8192 tokens; docs/measured/h200-2026-12-02/run2).
	expertBMEnv = envInt("TILERT_GPU_EXPERT_BM", 0)
	// gemmBM: TILERT_GPU_GEMM_BM, the block rows of the dense one-part
	// GEMM (64 or 128; anything else picks: kernels.P1BlockRows).
	gemmBM = envInt("TILERT_GPU_GEMM_BM", 0)
)

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// prefillChunk is the rows of one prefill forward as the environment or
// the defaults give it (before pickChunk's memory rule).
func prefillChunk() int {
	def := defaultChunkLen
	if !gemmOn {
		def = oldChunkLen
	}
	return min(envInt("TILERT_GPU_PREFILL_CHUNK", def), maxChunkLen)
}

// pickChunk is the backend's prefill rows per forward: the environment's
// TILERT_GPU_PREFILL_CHUNK when set; with the GEMMs on, on a GPU and
// outside a sharded engine, the largest power of two up to maxChunkLen
// whose workspace takes at most a quarter of the device's memory (one
// chunk streams every routed expert's weights once, so an 8192-token
// prompt in one chunk reads them once instead of 32 times at 256 rows);
// else prefillChunk's default. Never more rows than a prompt can have
// (max_seq_len rounded up to 256).
func (e *backend) pickChunk(src Source) int {
	most := (e.maxSeq + 255) / 256 * 256
	n := prefillChunk()
	cr, onGPU := e.r.(*cudaRunner)
	_, sharded := src.(*shardSource)
	if os.Getenv("TILERT_GPU_PREFILL_CHUNK") != "" || !gemmOn || !onGPU || sharded || cr.info.TotalMem <= 0 {
		return min(n, most)
	}
	budget := cr.info.TotalMem / 4
	for n = maxChunkLen; n > defaultChunkLen && (n/2 >= most || workspaceBytes(e, n) > budget); n /= 2 {
	}
	return min(n, most)
}

// gemmParts is the parts of x this engine's GEMMs split into: exact mode
// (float32 caches, the HF-golden checks) always 3, whatever
// TILERT_GPU_GEMM_SPLITS says, so its products stay float32's; serving mode
// (fp8_ds_mla or bf16 caches) the switch's value.
func (e *backend) gemmParts() int {
	if e.exact() || e.opts.Mode == engine.ModeExact {
		return 3
	}
	if e.fastPrefill() && !gemmSplitsSet {
		return 1
	}
	return gemmSplits
}

// fastPrefill: the engine was asked for engine.PrefillFast (serving mode
// only: newBackend refuses it with exact mode).
func (e *backend) fastPrefill() bool { return e.opts.Prefill == engine.PrefillFast }

// forwardParts is the parts of x a forward of these groups runs its GEMMs
// with, given the engine's (gemmParts): one part only for prefill, i.e.
// where some slot forwards a prompt chunk of at least gemmMinRows
// consecutive positions; a decode batch (1..3 rows a slot, MTP included)
// keeps 3 parts even when its many slots make it a GEMM, so decode stays
// the float32 forward greedy == CPU checks.
func forwardParts(parts int, groups []group) int {
	if parts != 1 {
		return parts
	}
	for _, g := range groups {
		if g.n >= gemmMinRows {
			return 1
		}
	}
	return 3
}

// gemmScratchOn says whether the forward needs the split scratch of the
// one-part GEMMs (gemm_p1.cu).
func (e *backend) gemmScratchOn() bool {
	return gemmOn && e.gemmParts() == 1
}

// expertTilesBig says whether the grouped experts run tiles of up to
// kernels.GemmExpertBigRows pairs (kernels.ExpertTiles) in a forward with
// parts parts of x: only the one-part kernels have them, and only when
// TILERT_GPU_EXPERT_BM=128 asks.
func expertTilesBig(parts int) bool {
	return parts == 1 && expertBMEnv == 128
}

// useGemm says whether a linear layer of M rows runs as a GEMM.
func useGemm(l dlin, M int) bool {
	return gemmOn && M >= gemmMinRows && l.kind != linF32
}

func (b *cudaDevice) gemmFP8(y, x, w, scale cuda.DevPtr, N, K, M, ldx, ldy, parts int) error {
	if parts == 1 {
		if b.p1(w, K, M) {
			bm := gemmBM
			if bm != 64 && bm != 128 {
				bm = kernels.P1BlockRows(N, M, b.c.Info().SMs)
			}
			return b.k.GemmFP8P1(b.s, y, x, w, scale, b.gemmWS, b.gemmWSBytes, N, K, M, ldx, ldy, bm)
		}
		return b.k.GemmFP8(b.s, y, x, w, scale, N, K, M, ldx, ldy, 1)
	}
	return b.k.GemmFP8(b.s, y, x, w, scale, N, K, M, ldx, ldy, parts)
}

// p1 says whether an fp8 GEMM of M rows of K takes the one-part kernels
// (gemm_p1.cu): the device has them and the scratch holds the rounded x.
func (b *cudaDevice) p1(w cuda.DevPtr, K, M int) bool {
	return b.gemmWS != 0 && b.k.GemmP1OK(w, K) && kernels.GemmP1ScratchBytes(M, K) <= b.gemmWSBytes
}

// absorbTCOn runs the prefill's absorbed-MLA products on tensor cores
// (kernels.AbsorbQTC / AbsorbVTC; 23 ms against 65 for an 8192-token
// prefill). The default with the GEMMs it goes with (the whole gpu-check
// passed with both, docs/measured/h200-2026-12-02-s7);
// TILERT_GPU_ABSORB_TC=0 goes back to absorb_q_fp8 / absorb_v_fp8.
var absorbTCOn = os.Getenv("TILERT_GPU_ABSORB_TC") != "0"

// absorbMany says whether the absorbed-MLA products of M rows run as
// tensor-core products (kernels.AbsorbQTC / AbsorbVTC, three fp16 parts:
// float32-exact products): the GEMMs' rows, fp8 weights, and the device
// has the kernels.
func (b *cudaDevice) absorbMany(fp8 bool, w cuda.DevPtr, M, R int) bool {
	return gemmOn && absorbTCOn && fp8 && M >= gemmMinRows && b.k.AbsorbTCOK(w, R)
}

// absorbQTC is absorbQ's tensor-core product, then the RoPE part of q
// copied out and rotated as the unfused path does.
func (b *cudaDevice) absorbQTC(out, qpe, q, w, s cuda.DevPtr, M, H, nope, R, ldq, hs, P int, rope kernels.QRope) error {
	if err := b.k.AbsorbQTC(b.s, out, q, w, s, M, H, nope, R, ldq, hs); err != nil || qpe == 0 {
		return err
	}
	return b.qpeOut(qpe, q, M, H, nope, ldq, hs, P, rope)
}

func (b *cudaDevice) gemmBF16(y, x, w cuda.DevPtr, N, K, M, ldx, ldy, parts int) error {
	return b.k.GemmBF16(b.s, y, x, w, N, K, M, ldx, ldy, parts)
}

func (b *cudaDevice) gemmExperts(y, x cuda.DevPtr, ldx, xRows int, wTable, sTable, tiles, xrows cuda.DevPtr, ntiles, nbig, N, K, parts int) error {
	if parts == 1 && b.p1(0, K, xRows) {
		return b.k.GemmFP8ExpertsP1(b.s, y, x, ldx, xRows, wTable, sTable, tiles, xrows, b.gemmWS, b.gemmWSBytes, ntiles, nbig, N, K)
	}
	if nbig > 0 {
		return errors.WithHint(errors.Newf("grouped experts: %d tiles of up to %d pairs without the one-part kernels", nbig, kernels.GemmExpertBigRows),
			"TILERT_GPU_EXPERT_BM=64 keeps every tile at 64 pairs")
	}
	return b.k.GemmFP8Experts(b.s, y, x, ldx, wTable, sTable, tiles, xrows, ntiles, N, K, parts)
}

func (b *cudaDevice) moeCombineRows(out, ey, wts, pos cuda.DevPtr, rows, k, N int) error {
	return b.k.MoECombineRows(b.s, out, ey, wts, pos, rows, k, N)
}

// The emulator computes the float32 GEMV's result (what the 3-part split
// reproduces up to summation order), 4 rows at a time; with one
// part, of x as gemm_split_p1 leaves it (p1Rows: fp16 after a power-of-two
// row scale; K % 16 != 0 takes gemm_fp8_tc_s1 on the GPU, bf16 x).
func (m *emuDevice) gemmFP8(y, x, w, scale cuda.DevPtr, N, K, M, ldx, ldy, parts int) error {
	if parts == 1 {
		xs, err := m.p1Rows(x, M, K, ldx, K%16 == 0)
		if err != nil {
			return err
		}
		defer m.free(xs)
		x, ldx = xs, K
	}
	return emuRows(M, ldx, ldy, x, y, func(yy, xx cuda.DevPtr, r int) error { return m.gemvFP8(yy, xx, w, scale, N, K, r, ldx, ldy) })
}

// rowScale is the power of two 2^s that the fp16 split (gemm_split_p1)
// scales a row by, bringing its largest |x| into
// [2^14, 2^15), and its inverse.
func rowScale(src []float32) (sc, inv float32) {
	var mx float32
	for _, v := range src {
		if a := float32(math.Abs(float64(v))); a > mx {
			mx = a
		}
	}
	e := 15
	if mx > 0 && mx <= math.MaxFloat32 {
		_, e = math.Frexp(float64(mx))
		e = max(-100, min(100, e))
	}
	return float32(math.Ldexp(1, 15-e)), float32(math.Ldexp(1, e-15))
}

// p1Rows is x as the one-part GEMMs multiply it: with f16 set,
// gemm_split_p1's rounding (each row scaled by the power of two that brings
// its largest |x| into [2^14, 2^15), rounded to fp16, scaled back), else
// gemm_tc's one bf16 part (round to nearest even). A new allocation of rows
// x K floats.
func (m *emuDevice) p1Rows(x cuda.DevPtr, rows, K, ldx int, f16 bool) (cuda.DevPtr, error) {
	out, err := m.alloc(int64(4 * rows * K))
	if err != nil {
		return 0, err
	}
	os := m.f32(out, rows*K)
	for r := 0; r < rows; r++ {
		src := m.f32(fptr(x, r*ldx), K)
		if f16 {
			p1Split(os[r*K:(r+1)*K], src)
			continue
		}
		for i, v := range src {
			os[r*K+i] = bf16RoundF32(v)
		}
	}
	return out, nil
}

// p1Split writes gemm_split_p1's fp16(x 2^s) 2^-s of src into dst.
func p1Split(dst, src []float32) {
	sc, inv := rowScale(src)
	for i, v := range src {
		dst[i] = f16Round(v*sc) * inv
	}
}

// bf16RoundF32 rounds v to bf16 (nearest, ties to even; NaN kept).
func bf16RoundF32(v float32) float32 {
	if v != v {
		return v
	}
	b := math.Float32bits(v)
	b += 0x7fff + (b>>16)&1
	return math.Float32frombits(b &^ 0xffff)
}

// f16Round rounds v to the nearest fp16 value (ties to even, fp16's
// subnormals; NaN and inf as they are).
func f16Round(v float32) float32 {
	a := math.Abs(float64(v))
	if a == 0 || math.IsNaN(a) || math.IsInf(a, 0) {
		return v
	}
	q := math.Ldexp(1, -24) // subnormal spacing
	if a >= math.Ldexp(1, -14) {
		q = math.Ldexp(1, math.Ilogb(a)-10)
	}
	r := math.RoundToEven(float64(v)/q) * q
	if math.Abs(r) > 65504 {
		return float32(math.Inf(int(math.Copysign(1, r))))
	}
	return float32(r)
}

func (m *emuDevice) gemmBF16(y, x, w cuda.DevPtr, N, K, M, ldx, ldy, parts int) error {
	if parts == 1 {
		xs, err := m.p1Rows(x, M, K, ldx, false)
		if err != nil {
			return err
		}
		defer m.free(xs)
		x, ldx = xs, K
	}
	return emuRows(M, ldx, ldy, x, y, func(yy, xx cuda.DevPtr, r int) error { return m.gemvBF16(yy, xx, w, N, K, r, ldx, ldy) })
}

func emuRows(M, ldx, ldy int, x, y cuda.DevPtr, f func(yy, xx cuda.DevPtr, rows int) error) error {
	for r := 0; r < M; r += 4 {
		if err := f(fptr(y, r*ldy), fptr(x, r*ldx), min(4, M-r)); err != nil {
			return err
		}
	}
	return nil
}

func (m *emuDevice) gemmExperts(y, x cuda.DevPtr, ldx, _ int, wTable, sTable, tiles, xrows cuda.DevPtr, ntiles, _, N, K, parts int) error {
	ts := m.i32(tiles, 3*ntiles)
	for t := 0; t < ntiles; t++ {
		e, start, n := int(ts[3*t]), int(ts[3*t+1]), int(ts[3*t+2])
		if n <= 0 {
			continue
		}
		wt, st := m.ptrs(wTable, e+1), m.ptrs(sTable, e+1)
		xr := m.i32(xrows, start+n)
		for i := start; i < start+n; i++ {
			xx := fptr(x, int(xr[i])*ldx)
			if parts == 1 {
				xs, err := m.p1Rows(xx, 1, K, K, K%16 == 0)
				if err != nil {
					return err
				}
				err = m.gemvFP8(fptr(y, i*N), xs, wt[e], st[e], N, K, 1, K, N)
				if ferr := m.free(xs); err == nil {
					err = ferr
				}
				if err != nil {
					return err
				}
				continue
			}
			if err := m.gemvFP8(fptr(y, i*N), xx, wt[e], st[e], N, K, 1, K, N); err != nil {
				return err
			}
		}
	}
	return nil
}

func (m *emuDevice) moeCombineRows(out, ey, wts, pos cuda.DevPtr, rows, k, N int) error {
	ps := m.i32(pos, rows*k)
	ws := m.f32(wts, rows*k)
	for r := 0; r < rows; r++ {
		maxP := 0
		for j := 0; j < k; j++ {
			maxP = max(maxP, int(ps[r*k+j]))
		}
		ys := m.f32(ey, (maxP+1)*N)
		os := m.f32(fptr(out, r*N), N)
		for n := 0; n < N; n++ {
			var s float32
			for j := 0; j < k; j++ {
				s += ws[r*k+j] * ys[int(ps[r*k+j])*N+n]
			}
			os[n] = s
		}
	}
	return nil
}

func (gb *graphDevice) gemmFP8(y, x, w, scale cuda.DevPtr, N, K, M, ldx, ldy, parts int) error {
	_ = gb.rec("gemmFP8", int64(N)*int64(K), func(b device) error { return b.gemmFP8(y, x, w, scale, N, K, M, ldx, ldy, parts) },
		ku(y), ku(x), ku(w), ku(scale), ki(N), ki(K), ki(M), ki(ldx), ki(ldy), ki(parts))
	return gb.shaped(N, K, M)
}

func (gb *graphDevice) gemmBF16(y, x, w cuda.DevPtr, N, K, M, ldx, ldy, parts int) error {
	_ = gb.rec("gemmBF16", 2*int64(N)*int64(K), func(b device) error { return b.gemmBF16(y, x, w, N, K, M, ldx, ldy, parts) },
		ku(y), ku(x), ku(w), ki(N), ki(K), ki(M), ki(ldx), ki(ldy), ki(parts))
	return gb.shaped(N, K, M)
}

func (gb *graphDevice) gemmExperts(y, x cuda.DevPtr, ldx, xRows int, wTable, sTable, tiles, xrows cuda.DevPtr, ntiles, nbig, N, K, parts int) error {
	_ = gb.rec("gemmExperts", int64(N)*int64(K), func(b device) error {
		return b.gemmExperts(y, x, ldx, xRows, wTable, sTable, tiles, xrows, ntiles, nbig, N, K, parts)
	}, ku(y), ku(x), ki(ldx), ki(xRows), ku(wTable), ku(sTable), ku(tiles), ku(xrows), ki(ntiles), ki(nbig), ki(N), ki(K), ki(parts))
	return gb.shaped(ntiles, N, K)
}

func (gb *graphDevice) moeCombineRows(out, ey, wts, pos cuda.DevPtr, rows, k, N int) error {
	return gb.rec("moeCombineRows", int64(4*(k+1)*rows*N), func(b device) error { return b.moeCombineRows(out, ey, wts, pos, rows, k, N) },
		ku(out), ku(ey), ku(wts), ku(pos), ki(rows), ki(k), ki(N))
}

// moeGroupWorkspace holds the grouped MoE's buffers for maxRows rows
// (allocated with the workspace when the GEMMs are on).
type moeGroupWorkspace struct {
	meta       cuda.DevPtr // int32: tiles [maxTiles][3], xrows, pos, identity [pairs] each
	eg, eu, ey cuda.DevPtr // [pairs][moe intermediate], [pairs][hidden]
	maxTiles   int
	// The host side of moeGrouped, reused: the ids as downloaded and
	// decoded, the order, the meta before its upload.
	rawHost, metaHost []byte
	ids               []int32
	order             expertOrderBufs
}

// groupedMoE says whether a MoE layer of M rows sorts its pairs by expert:
// that needs the expert ids on the host, a round trip a captured decode
// step cannot make, so only outside graphs (prefill, teacher forcing).
func (f *fwd) groupedMoE() bool {
	if !gemmOn || f.M < gemmMinRows || f.e.ws.grp.meta == 0 {
		return false
	}
	gb, graphed := f.o.b.(*graphDevice)
	return !graphed || gb.timed != nil
}

// moeGrouped is moe's routed part for many rows, the shared expert
// included (moe adds none after it): ws.eidx comes back to the host,
// the pairs are ordered by expert (stable: by row inside an expert;
// expertOrder) into tiles of at most kernels.GemmTileRows, and gate, up,
// SiLU, down and the weighted combine run once over all pairs. Results
// equal the per-row path's up to the GEMMs' summation order.
//
// The ids download is the one host round trip of a prefill's MoE layer:
// the device idles from the routing until the host has ordered the pairs
// and queued the grouped GEMMs. So the shared expert (which needs no ids)
// is queued right after the download, into ws.tmp, and runs while the host
// orders the pairs; it is added into ws.mo after the combine, as
// addSharedFFN does (the same launches on the same inputs, so the same
// bits). The order is a counting sort, O(pairs): the stable comparison
// sort it replaces took 13-19 ms for the 65536 pairs of an 8192-row chunk
// (8 experts a row), the whole gap between an 8192-token prefill's wall
// time and its device time on the H200 (docs/measured/next5/pgap.sh).
func (f *fwd) moeGrouped(lw *dlayer) {
	e, o, ws := f.e, f.o, f.e.ws
	c := e.cfg
	H, M := c.HiddenSize, f.M
	K, MI := c.NumExpertsPerTok, c.MoEIntermediateSize
	P := M * K
	g := &ws.grp
	raw := g.hostBuf(&g.rawHost, 4*P)
	o.do(o.b.download(raw, ws.eidx))
	if o.err != nil {
		return
	}
	if lw.HasShared {
		f.ffn(lw.ShGate, lw.ShUp, lw.ShDown, ws.tmp) // on the device while the host orders the pairs
	}
	ids := g.ids[:0]
	for i := 0; i < P; i++ {
		ids = append(ids, int32(binary.LittleEndian.Uint32(raw[4*i:])))
	}
	g.ids = ids
	pairs, eid, err := expertOrder(ids, c.NRoutedExperts, &g.order)
	if err != nil {
		o.do(err)
		return
	}
	parts := o.gemmParts()
	tl, nbig := kernels.ExpertTiles(eid, expertTilesBig(parts))
	nt := len(tl) / 3
	if nt > g.maxTiles {
		o.do(errors.Newf("grouped MoE: %d tiles for %d pairs (at most %d)", nt, P, g.maxTiles))
		return
	}
	// One upload: tiles [maxTiles][3], xrows [P], pos [P], identity [P].
	xrowsAt, posAt, identAt := 3*g.maxTiles, 3*g.maxTiles+P, 3*g.maxTiles+2*P
	meta := g.hostBuf(&g.metaHost, 4*(3*g.maxTiles+3*P))
	clear(meta[:4*3*g.maxTiles])
	put := func(i int, v int) { binary.LittleEndian.PutUint32(meta[4*i:], uint32(int32(v))) }
	for i, v := range tl {
		put(i, int(v))
	}
	for i, p := range pairs {
		put(xrowsAt+i, int(p)/K)
		put(posAt+int(p), i)
		put(identAt+i, i)
	}
	o.do(o.b.upload(g.meta, meta))
	tiles, xrows, pos, ident := g.meta, fptr(g.meta, xrowsAt), fptr(g.meta, posAt), fptr(g.meta, identAt)
	o.do(o.b.gemmExperts(g.eg, ws.h, H, M, lw.expW[0], lw.expS[0], tiles, xrows, nt, nbig, MI, H, parts))
	o.do(o.b.gemmExperts(g.eu, ws.h, H, M, lw.expW[1], lw.expS[1], tiles, xrows, nt, nbig, MI, H, parts))
	o.do(o.b.siluMul(g.eg, g.eg, g.eu, P, MI, MI, MI, MI))
	// The down projection reads pair i's own row of eg.
	o.do(o.b.gemmExperts(g.ey, g.eg, MI, P, lw.expW[2], lw.expS[2], tiles, ident, nt, nbig, H, MI, parts))
	o.do(o.b.moeCombineRows(ws.mo, g.ey, ws.ewts, pos, M, K, H))
	if lw.HasShared {
		o.do(o.b.add(ws.mo, ws.mo, ws.tmp, M*H))
	}
}

// expertOrder orders the pairs (row-major (row, slot) indices into ids) by
// expert, stably (by pair index inside an expert), as a counting sort: the
// same order as slices.SortStableFunc by ids[p] (TestExpertOrder). It
// returns the ordered pairs and their experts, both in order's buffers
// (reused across calls), or an error for an id outside [0, E) (non-finite
// router logits).
func expertOrder(ids []int32, E int, order *expertOrderBufs) (pairs, eid []int32, err error) {
	cnt := order.cnt[:0]
	for range E + 1 {
		cnt = append(cnt, 0)
	}
	order.cnt = cnt
	for _, id := range ids {
		if id < 0 || int(id) >= E {
			return nil, nil, errors.Newf("moe routing chose expert %d (of %d): the router logits are not finite", id, E)
		}
		cnt[id+1]++
	}
	for x := 1; x <= E; x++ {
		cnt[x] += cnt[x-1] // cnt[x]: the first place of expert x's pairs
	}
	P := len(ids)
	pairs, eid = growI32(&order.pairs, P), growI32(&order.eid, P)
	for p, id := range ids {
		at := cnt[id]
		cnt[id]++
		pairs[at], eid[at] = int32(p), id
	}
	return pairs, eid, nil
}

// expertOrderBufs are expertOrder's buffers, kept between calls.
type expertOrderBufs struct {
	cnt        []int
	pairs, eid []int32
}

// growI32 returns (*b)[:n], growing *b when it is shorter.
func growI32(b *[]int32, n int) []int32 {
	if cap(*b) < n {
		*b = make([]int32, n)
	}
	return (*b)[:n]
}

// hostBuf returns (*b)[:n], growing *b when it is shorter: the grouped
// MoE's host copies of the ids and the meta, reused layer after layer
// (the device has read the last upload from it: the next use follows a
// download, which waits for the stream).
func (g *moeGroupWorkspace) hostBuf(b *[]byte, n int) []byte {
	if cap(*b) < n {
		*b = make([]byte, n)
	}
	return (*b)[:n]
}

// allocGroup allocates the grouped MoE's buffers for M rows.
func (ws *workspace) allocGroup(e *backend, b device, M int) error {
	for _, a := range ws.grp.bufs(e.cfg, M) {
		p, err := e.alloc(b, int64(4*max(1, a.n)))
		if err != nil {
			return err
		}
		*a.p = p
	}
	return nil
}

// bufs lists the grouped MoE's buffers for M rows of model c (none when
// the GEMMs are off or c has no routed experts) and sets maxTiles.
func (g *moeGroupWorkspace) bufs(c *model.Config, M int) []wsBuf {
	if !gemmOn || M < gemmMinRows || c.NRoutedExperts == 0 {
		return nil
	}
	K := max(1, c.NumExpertsPerTok)
	P := M * K
	g.maxTiles = P/kernels.GemmTileRows + c.NRoutedExperts + 1
	return []wsBuf{{&g.meta, 3*g.maxTiles + 3*P}, {&g.eg, P * c.MoEIntermediateSize}, {&g.eu, P * c.MoEIntermediateSize}, {&g.ey, P * c.HiddenSize}}
}

// groupBytes is what allocGroup takes for M rows of model c.
func groupBytes(c *model.Config, M int) int64 {
	var n int64
	for _, a := range new(moeGroupWorkspace).bufs(c, M) {
		n += int64(4 * max(1, a.n))
	}
	return n
}

// gemmScratchBytes is the one-part GEMM scratch a forward of M rows of
// model c needs: M rows of the widest linear input (TestGemmScratchCovers
// checks every linear of the presets against it), or the routed pairs of
// the expert down projection.
func gemmScratchBytes(c *model.Config, M int) int64 {
	NH := c.NumHeads
	kmax := max(2*c.HiddenSize, c.IntermediateSize, c.QLoraRank, NH*c.VHeadDim, NH*(c.QKNopeHeadDim+c.QKRopeHeadDim),
		c.MoEIntermediateSize*max(1, c.NSharedExperts), c.IndexNHeads*c.IndexHeadDim)
	return max(kernels.GemmP1ScratchBytes(M, kmax), kernels.GemmP1ScratchBytes(M*max(1, c.NumExpertsPerTok), c.MoEIntermediateSize))
}

// allocGemmScratch gives the GPU the one-part GEMM's scratch for the
// largest split a forward of M rows makes: M rows of the widest linear
// input, or the routed pairs of the expert down projection. It belongs to
// the runner (one stream): ranks sharing a runner run one after another on
// it and share the largest.
func (e *backend) allocGemmScratch(b device, M int) error {
	cd, ok := b.(*cudaDevice)
	cr, rok := e.r.(*cudaRunner)
	c := e.cfg
	if !ok || !rok || !e.gemmScratchOn() || M < gemmMinRows {
		return nil
	}
	n := gemmScratchBytes(c, M)
	if n <= cr.gemmWSBytes {
		return nil
	}
	p, err := e.alloc(b, n)
	if err != nil {
		return err
	}
	cr.gemmWS, cr.gemmWSBytes = p, n
	cd.gemmWS, cd.gemmWSBytes = p, n
	return nil
}
