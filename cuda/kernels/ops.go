package kernels

import (
	"fmt"
	"os"
	"slices"

	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/cuda"
)

// Typed launchers for the embedded kernels. Shapes are checked here so a
// bad call fails with a message instead of a device fault; pointers are the
// caller's responsibility. Activations are float32, row-major.

// Byte sizes of the vLLM cache layouts the kernels read and write.
const (
	MLATokenBytes     = 656                // 512 fp8 + 4 float32 scales + 64 bf16
	IndexerPageTokens = 64                 // tokens per indexer page
	IndexerPageBytes  = 64*128 + 64*4      // 8448
	MLAPageBytes      = 64 * MLATokenBytes // tokens are interleaved per page
	MLALatentDim      = 512
	MLARopeDim        = 64
	IndexerHeadDim    = 128
	gemvRowsPerBlock  = 8 // 256 threads, a warp per output row
	maxGemvM          = 4
	maxRouteExperts   = 1024
	maxRouteGroups    = 32
	maxRouteTopK      = 64
)

func cdiv(a, b int) int { return (a + b - 1) / b }

func checkGemv(N, K, M, ldx, ldy int) error {
	if N <= 0 || K <= 0 || M <= 0 || M > maxGemvM {
		return errors.Newf("gemv: N=%d K=%d M=%d (M must be 1..%d)", N, K, M, maxGemvM)
	}
	if ldx < K || (M > 1 && ldy < N) {
		return errors.Newf("gemv: ldx=%d < K=%d or ldy=%d < N=%d", ldx, K, ldy, N)
	}
	return nil
}

// gemvKernels lists the GEMV variants by rows per warp (see gemv.cu).
// forceGemvRows makes every GEMV use that many rows per warp (tests cover
// each variant with it); 0 lets gemvName choose.
var forceGemvRows int

var gemvKernels = map[string][]int{
	"gemv_fp8":         {4, 2, 1},
	"gemv_bf16":        {4, 2, 1},
	"gemv_f32":         {4, 1},
	"gemv_fp8_experts": {4, 1},
}

// gemvName picks rows per warp for N outputs (times slots blocks in y): the
// most rows that still gives every SM two blocks, so big matrices reuse x
// loads and small ones spread out.
func (k *Set) gemvName(base string, N, slots int) (string, int) {
	rs := gemvKernels[base]
	if f := forceGemvRows; f > 0 && slices.Contains(rs, f) {
		return fmt.Sprintf("%s_r%d", base, f), f
	}
	target := 2 * max(1, k.c.Info().SMs)
	for _, r := range rs {
		if cdiv(N, gemvRowsPerBlock*r)*slots >= target {
			return fmt.Sprintf("%s_r%d", base, r), r
		}
	}
	r := rs[len(rs)-1]
	return fmt.Sprintf("%s_r%d", base, r), r
}

func (k *Set) gemv(base string, s cuda.Stream, y, x, w, scale, resid cuda.DevPtr, N, K, M, ldx, ldy int) error {
	if err := checkGemv(N, K, M, ldx, ldy); err != nil {
		return err
	}
	name, r := k.gemvName(base, N, 1)
	return k.launch(name, cuda.D1(cdiv(N, gemvRowsPerBlock*r)), cuda.D1(256), 0, s, w, scale, x, y, resid, N, K, M, ldx, ldy)
}

// GemvFP8 computes y[m][n] = sum_k w[n][k]*scale[n/128][k/128]*x[m][k] (+ resid[m][n])
// for m < M <= 4; w is fp8 e4m3 [N][K], scale float32 [ceil(N/128)][ceil(K/128)].
// resid may be 0 or equal to y (in-place residual add).
func (k *Set) GemvFP8(s cuda.Stream, y, x, w, scale, resid cuda.DevPtr, N, K, M, ldx, ldy int) error {
	return k.gemv("gemv_fp8", s, y, x, w, scale, resid, N, K, M, ldx, ldy)
}

// GemvBF16 is GemvFP8 for bf16 weights without scales.
func (k *Set) GemvBF16(s cuda.Stream, y, x, w, resid cuda.DevPtr, N, K, M, ldx, ldy int) error {
	return k.gemv("gemv_bf16", s, y, x, w, 0, resid, N, K, M, ldx, ldy)
}

// GemvF32 is GemvFP8 for float32 weights.
func (k *Set) GemvF32(s cuda.Stream, y, x, w, resid cuda.DevPtr, N, K, M, ldx, ldy int) error {
	return k.gemv("gemv_f32", s, y, x, w, 0, resid, N, K, M, ldx, ldy)
}

// GemvFP8Experts runs one fp8 GEMV per top-k slot j < slots with the expert
// ids[j] read on the device: weights wTable[e] ([N][K] fp8) and scales
// sTable[e] are device arrays of device pointers. Input row j is
// x + j*xstride floats (xstride 0 shares x), output row j is y + j*N.
func (k *Set) GemvFP8Experts(s cuda.Stream, y, x cuda.DevPtr, xstride int, wTable, sTable, ids cuda.DevPtr, slots, N, K int) error {
	if N <= 0 || K <= 0 || slots <= 0 || xstride < 0 {
		return errors.Newf("gemv experts: N=%d K=%d slots=%d xstride=%d", N, K, slots, xstride)
	}
	name, r := k.gemvName("gemv_fp8_experts", N, slots)
	return k.launch(name, cuda.D3(cdiv(N, gemvRowsPerBlock*r), slots, 1), cuda.D1(256), 0, s, wTable, sTable, ids, x, xstride, y, N, K)
}

// Wide fp8 GEMVs (gemv_wide.cu): a block owns R rows and its threads split
// K, so small N and long K still keep every SM streaming. forceGemvWideRows
// pins R for tests (0: gemvWideRows chooses).
var forceGemvWideRows int

const gemvWideLoads = 4 // GEMV_WIDE_U: 16-byte loads in flight per thread

// gemvWideOK says whether the wide kernels can take the shape: whole
// 16-byte chunks of K (per weights of esize bytes) and float4-aligned rows
// of x.
func gemvWideOK(x cuda.DevPtr, K, ldx, esize int) bool {
	return (K*esize)%16 == 0 && ldx%4 == 0 && uint64(x)%16 == 0
}

// gemvWideRows picks rows per block: the most rows whose K still fits one
// round of loads per thread, then fewer while the grid (times slots) would
// not give every SM four blocks.
func (k *Set) gemvWideRows(N, K, esize, slots int) int {
	if f := forceGemvWideRows; f == 1 || f == 2 || f == 4 || f == 8 {
		return f
	}
	return gemvWideRowsFor(k.c.Info().SMs, N, K*esize, slots)
}

// gemvWideRowsFor: kbytes is the bytes of one weight row.
func gemvWideRowsFor(sms, N, kbytes, slots int) int {
	chunks := kbytes / 16
	r := 8
	for r > 1 && r*chunks > 256*gemvWideLoads {
		r /= 2
	}
	target := 4 * max(1, sms)
	for r > 1 && cdiv(N, r)*slots < target {
		r /= 2
	}
	return r
}

// GemvFP8Wide is GemvFP8 (same arguments and result up to float32 rounding
// order) through the wide kernels; shapes they cannot take (K % 16 != 0,
// unaligned x) run GemvFP8. Results are reproducible run to run: partial
// sums combine in a fixed order.
func (k *Set) GemvFP8Wide(s cuda.Stream, y, x, w, scale, resid cuda.DevPtr, N, K, M, ldx, ldy int) error {
	if err := checkGemv(N, K, M, ldx, ldy); err != nil {
		return err
	}
	if !gemvWideOK(x, K, ldx, 1) || uint64(w)%16 != 0 {
		return k.GemvFP8(s, y, x, w, scale, resid, N, K, M, ldx, ldy)
	}
	r := k.gemvWideRows(N, K, 1, 1)
	return k.launch(fmt.Sprintf("gemv_fp8_wide_r%d", r), cuda.D1(cdiv(N, r)), cuda.D1(256), 0, s, w, scale, x, y, resid, N, K, M, ldx, ldy)
}

// GemvBF16Wide is GemvBF16 through the wide kernels, with the same
// fallback as GemvFP8Wide (K % 8 != 0, unaligned x or w).
func (k *Set) GemvBF16Wide(s cuda.Stream, y, x, w, resid cuda.DevPtr, N, K, M, ldx, ldy int) error {
	if err := checkGemv(N, K, M, ldx, ldy); err != nil {
		return err
	}
	if !gemvWideOK(x, K, ldx, 2) || uint64(w)%16 != 0 {
		return k.GemvBF16(s, y, x, w, resid, N, K, M, ldx, ldy)
	}
	r := k.gemvWideRows(N, K, 2, 1)
	return k.launch(fmt.Sprintf("gemv_bf16_wide_r%d", r), cuda.D1(cdiv(N, r)), cuda.D1(256), 0, s, w, cuda.DevPtr(0), x, y, resid, N, K, M, ldx, ldy)
}

// GemvFP8ExpertsWide is GemvFP8Experts through the wide kernels (expert
// weights must be 16-byte aligned, as device allocations are); shapes they
// cannot take run GemvFP8Experts.
func (k *Set) GemvFP8ExpertsWide(s cuda.Stream, y, x cuda.DevPtr, xstride int, wTable, sTable, ids cuda.DevPtr, slots, N, K int) error {
	if N <= 0 || K <= 0 || slots <= 0 || xstride < 0 {
		return errors.Newf("gemv experts: N=%d K=%d slots=%d xstride=%d", N, K, slots, xstride)
	}
	if !gemvWideOK(x, K, K, 1) || xstride%4 != 0 {
		return k.GemvFP8Experts(s, y, x, xstride, wTable, sTable, ids, slots, N, K)
	}
	r := k.gemvWideRows(N, K, 1, slots)
	return k.launch(fmt.Sprintf("gemv_fp8_experts_wide_r%d", r), cuda.D3(cdiv(N, r), slots, 1), cuda.D1(256), 0, s, wTable, sTable, ids, x, xstride, y, N, K)
}

// smallFast: rmsnorm, add_rmsnorm and moe_route run as rmsnorm_reg,
// add_rmsnorm_reg (every load of the row issued at once) and moe_route_rank
// (the selection by rank, no serial rounds), bit-identical to the loop
// kernels; TILERT_GPU_SMALL=0 keeps those (comparisons). A variable so that
// tests can run both.
var smallFast = os.Getenv("TILERT_GPU_SMALL") != "0"

// normRegs is NORM_REGS in norm.cu: the elements per thread the _reg norms
// hold in registers.
const normRegs = 8

// normRegsFit says whether rows of D floats take the _reg norm kernels.
func normRegsFit(D int) bool { return smallFast && cdiv(D, normThreads(D)) <= normRegs }

func normThreads(D int) int {
	t := min(1024, cdiv(D, 4)*1)
	t = cdiv(t, 32) * 32
	return max(32, t)
}

// RMSNorm normalises rows of D floats: y = x*rsqrt(mean(x^2)+eps)*w. y may be x.
func (k *Set) RMSNorm(s cuda.Stream, y, x, w cuda.DevPtr, rows, D, ldx, ldy int, eps float32) error {
	if rows <= 0 || D <= 0 || ldx < D || ldy < D {
		return errors.Newf("rmsnorm: rows=%d D=%d ldx=%d ldy=%d", rows, D, ldx, ldy)
	}
	name := "rmsnorm"
	if normRegsFit(D) {
		name = "rmsnorm_reg"
	}
	return k.launch(name, cuda.D1(rows), cuda.D1(normThreads(D)), 0, s, x, w, y, D, ldx, ldy, eps)
}

// AddRMSNorm adds b into the residual rows x (x += b) and writes
// y = x*rsqrt(mean(x^2)+eps)*w: Add then RMSNorm in one launch, bit-identical
// to the two. y must not alias x or b.
func (k *Set) AddRMSNorm(s cuda.Stream, y, x, b, w cuda.DevPtr, rows, D, ldx, ldb, ldy int, eps float32) error {
	if rows <= 0 || D <= 0 || ldx < D || ldb < D || ldy < D {
		return errors.Newf("add_rmsnorm: rows=%d D=%d ldx=%d ldb=%d ldy=%d", rows, D, ldx, ldb, ldy)
	}
	name := "add_rmsnorm"
	if normRegsFit(D) {
		name = "add_rmsnorm_reg"
	}
	return k.launch(name, cuda.D1(rows), cuda.D1(normThreads(D)), 0, s, x, b, w, y, D, ldx, ldb, ldy, eps)
}

// LayerNorm normalises rows: y = (x-mean)*rsqrt(var+eps)*w + b (w, b may be 0).
func (k *Set) LayerNorm(s cuda.Stream, y, x, w, b cuda.DevPtr, rows, D, ldx, ldy int, eps float32) error {
	if rows <= 0 || D <= 0 || ldx < D || ldy < D {
		return errors.Newf("layernorm: rows=%d D=%d ldx=%d ldy=%d", rows, D, ldx, ldy)
	}
	return k.launch("layernorm", cuda.D1(rows), cuda.D1(normThreads(D)), 0, s, x, w, b, y, D, ldx, ldy, eps)
}

// RoPE rotates dims [off, off+rot) of each of rows rows of x ([rows][ld]) in
// place; row r is token r/rowsPerTok at position pos[token] (int32 on the
// device); cos/sin are [maxPos][rot/2] float32 tables. interleaved: pairs
// (2i, 2i+1); else half-split pairs (i, i+rot/2).
func (k *Set) RoPE(s cuda.Stream, x, pos, cos, sin cuda.DevPtr, rows, rowsPerTok, ld, off, rot int, interleaved bool) error {
	if rows <= 0 || rowsPerTok <= 0 || rot <= 0 || rot%2 != 0 || off < 0 || off+rot > ld {
		return errors.Newf("rope: rows=%d rowsPerTok=%d ld=%d off=%d rot=%d", rows, rowsPerTok, ld, off, rot)
	}
	il := 0
	if interleaved {
		il = 1
	}
	n := rows * rot / 2
	return k.launch("rope", cuda.D1(cdiv(n, 256)), cuda.D1(256), 0, s, x, pos, cos, sin, rows, rowsPerTok, ld, off, rot, il)
}

// Add computes y = a + b over n floats (y may alias a or b).
func (k *Set) Add(s cuda.Stream, y, a, b cuda.DevPtr, n int) error {
	if n <= 0 {
		return errors.Newf("add: n=%d", n)
	}
	return k.launch("add_f32", cuda.D1(min(cdiv(n, 256), 4096)), cuda.D1(256), 0, s, y, a, b, int64(n))
}

// SiluMul computes out[r][i] = silu(gate[r][i]) * up[r][i] for i < I.
func (k *Set) SiluMul(s cuda.Stream, out, gate, up cuda.DevPtr, rows, I, ldg, ldu, ldo int) error {
	if rows <= 0 || I <= 0 || ldg < I || ldu < I || ldo < I {
		return errors.Newf("silu_mul: rows=%d I=%d", rows, I)
	}
	return k.launch("silu_mul", cuda.D1(cdiv(rows*I, 256)), cuda.D1(256), 0, s, gate, up, out, rows, I, ldg, ldu, ldo)
}

// EmbedBF16 gathers rows ids[0..T) (int32 on the device) of a bf16 [V][D]
// table into float32 out [T][D].
func (k *Set) EmbedBF16(s cuda.Stream, out, table, ids cuda.DevPtr, T, D int) error {
	if T <= 0 || D <= 0 {
		return errors.Newf("embed: T=%d D=%d", T, D)
	}
	return k.launch("embed_bf16", cuda.D1(T), cuda.D1(256), 0, s, table, ids, out, D)
}

// EmbedBF16Checked is EmbedBF16 with an id outside [0, V) giving a NaN row
// instead of a read outside the table.
func (k *Set) EmbedBF16Checked(s cuda.Stream, out, table, ids cuda.DevPtr, T, D, V int) error {
	if T <= 0 || D <= 0 || V <= 0 {
		return errors.Newf("embed: T=%d D=%d V=%d", T, D, V)
	}
	return k.launch("embed_bf16_checked", cuda.D1(T), cuda.D1(256), 0, s, table, ids, out, D, V)
}

// MoECombine computes out[n] = resid[n] + sum_j w[j]*y[j][n] for kslots rows
// of N (resid may be 0 or alias out).
func (k *Set) MoECombine(s cuda.Stream, out, y, w, resid cuda.DevPtr, kslots, N int) error {
	if kslots <= 0 || N <= 0 {
		return errors.Newf("moe_combine: k=%d N=%d", kslots, N)
	}
	return k.launch("moe_combine", cuda.D1(cdiv(N, 256)), cuda.D1(256), 0, s, y, w, resid, out, kslots, N)
}

// MoERoute routes T tokens: logits [T][E] float32 (router GEMV output), bias
// [E] (e_score_correction_bias, may be 0). Writes idx [T][K] int32 and wts
// [T][K] float32 (see moe.cu for the exact rule).
func (k *Set) MoERoute(s cuda.Stream, idx, wts, logits, bias cuda.DevPtr, T, E, K, ngroup, topkGroup int, norm bool, scale float32) error {
	if T <= 0 || E <= 0 || E > maxRouteExperts || K <= 0 || K > min(E, maxRouteTopK) || ngroup > maxRouteGroups {
		return errors.Newf("moe_route: T=%d E=%d K=%d ngroup=%d (E<=%d, K<=%d, ngroup<=%d)", T, E, K, ngroup, maxRouteExperts, maxRouteTopK, maxRouteGroups)
	}
	if ngroup > 1 && (E%ngroup != 0 || topkGroup <= 0) {
		return errors.Newf("moe_route: E=%d not divisible into %d groups or topk_group=%d", E, ngroup, topkGroup)
	}
	nv := 0
	if norm {
		nv = 1
	}
	name := "moe_route"
	if smallFast {
		name = "moe_route_rank"
		if RouteSort {
			name = "moe_route_sort"
		}
	}
	return k.launch(name, cuda.D1(T), cuda.D1(cdiv(E, 32)*32), 0, s, logits, bias, idx, wts, E, K, ngroup, topkGroup, nv, scale)
}

// RouteSort makes MoERoute launch moe_route_sort (moe.cu: moe_route_rank's
// outputs, each warp's experts sorted in registers so that a candidate ranks
// among at most 32 x min(K, 32) candidates instead of every kept expert),
// built in session 52 after its block clocks timed moe_route_rank's one
// block at 5.5 us a layer on DeepSeek-V3.2 dims and 6.6-8.4 on GLM-5 dims.
// The same outputs as moe_route bit for bit (TestKernelSmallFast, 36 cases,
// on an H100). Session 52 call C (one H100, 9 MoE layers, one bank,
// A/B/A/B): 1 slot DeepSeek-V3.2 dims -15 / -13 us a step at 8192, -19 /
// -17 at 131072; GLM-5 dims -21 / -25 and -19 / -19; GLM-5 dims MTP -16 /
// -11; DeepSeek-V3.2 dims 4 slots 0 / +2. The default; the engine clears
// it with TILERT_GPU_ROUTE_SORT=0.
var RouteSort = true

// IndexerScores writes out[q][t] (row stride ldOut) for t < T:
// sum_h w[q][h]*ReLU(qkScale * q[q][h].k_t) over the fp8 indexer cache, -inf
// for t >= lens[q]. q: [nq][H][128], w: [nq][H], lens: int32 [nq],
// blockTable: int32 page per 64-token block (0: identity).
func (k *Set) IndexerScores(s cuda.Stream, out, q, w, cache, blockTable, lens cuda.DevPtr, nq, H, T, ldOut int, qkScale float32) error {
	if nq <= 0 || H <= 0 || T <= 0 || ldOut < T {
		return errors.Newf("indexer: nq=%d H=%d T=%d ldOut=%d", nq, H, T, ldOut)
	}
	return k.launch("indexer_scores", cuda.D3(cdiv(T, IndexerPageTokens), nq, 1), cuda.D1(256), 0, s, q, w, cache, blockTable, lens, out, H, T, ldOut, qkScale)
}

// TopK writes, per row, the indices of the K largest of scores[row][0..n)
// (n = min(lens[row], T), lens may be 0) in ascending index order, ties at
// the threshold to the lower index; n <= K gives 0..n-1 then -1.
func (k *Set) TopK(s cuda.Stream, out, scores, lens cuda.DevPtr, rows, T, K, ld, ldOut int) error {
	if rows <= 0 || T <= 0 || K <= 0 || ld < T || ldOut < K {
		return errors.Newf("topk: rows=%d T=%d K=%d ld=%d ldOut=%d", rows, T, K, ld, ldOut)
	}
	return k.launch("topk_rows", cuda.D1(rows), cuda.D1(1024), 0, s, scores, ld, lens, T, K, out, ldOut)
}

// MLAWorkspaceBytes is the scratch MLADecode needs for nsplit > 1.
func MLAWorkspaceBytes(nq, H, nsplit int) int64 {
	if nsplit <= 1 {
		return 0
	}
	return int64(nq*H*nsplit) * (MLALatentDim + 2) * 4
}

// MLASplits picks how many token ranges MLADecode splits into so about
// eight blocks per SM are in flight (at least 64 tokens per range).
func (k *Set) MLASplits(nq, H, maxTokens int) int {
	want := cdiv(8*max(1, k.c.Info().SMs), nq*H)
	return max(1, min(want, cdiv(maxTokens, 64)))
}

// MLADecode runs absorbed MLA attention for nq query rows and H heads over
// the fp8_ds_mla cache: qn [nq][H][512], qp [nq][H][64], lens int32 [nq],
// out [nq][H][512], lse [nq][H] (may be 0); scale multiplies q.k.
// Sparse: indices [nq][ldIdx] int32 with nidx entries used per row (<0
// skipped). Dense (indices 0): every t < lens[q]; nidx must then bound
// max(lens). nsplit > 1 splits the tokens over more blocks and needs ws of
// MLAWorkspaceBytes(nq, H, nsplit) bytes.
func (k *Set) MLADecode(s cuda.Stream, out, lse, qn, qp, cache, blockTable, indices, lens, ws cuda.DevPtr, nq, H, nidx, ldIdx, nsplit int, scale float32) error {
	if nq <= 0 || H <= 0 || nidx <= 0 || (indices != 0 && ldIdx < nidx) || nsplit <= 0 || (nsplit > 1 && ws == 0) {
		return errors.Newf("mla: nq=%d H=%d nidx=%d ldIdx=%d nsplit=%d ws=%#x", nq, H, nidx, ldIdx, nsplit, uint64(ws))
	}
	tps := cdiv(cdiv(nidx, nsplit), 32) * 32 // whole tiles per split
	nsplit = cdiv(nidx, tps)
	partO, partML := ws, ws.Add(int64(nq*H*nsplit)*MLALatentDim*4)
	if err := k.launch("mla_decode", cuda.D3(H, nq, nsplit), cuda.D1(128), 0, s, qn, qp, cache, blockTable, indices, ldIdx, nidx, lens, out, lse, H, scale, tps, partO, partML); err != nil {
		return err
	}
	if nsplit == 1 {
		return nil
	}
	return k.launch("mla_combine", cuda.D1(nq*H), cuda.D1(128), 0, s, partO, partML, nsplit, out, lse)
}

// Argmax writes out[r] = arg-max of x[r][0..n) (ties to the lower index) and,
// when val != 0, the maximum.
func (k *Set) Argmax(s cuda.Stream, out, val, x cuda.DevPtr, rows, n, ld int) error {
	if rows <= 0 || n <= 0 || ld < n {
		return errors.Newf("argmax: rows=%d n=%d ld=%d", rows, n, ld)
	}
	return k.launch("argmax_rows", cuda.D1(rows), cuda.D1(1024), 0, s, x, n, ld, out, val)
}

// argmaxWideBlocks is the most blocks ArgmaxWide spreads one row over.
const argmaxWideBlocks = 128

// ArgmaxScratchBytes is the scratch ArgmaxWide needs for rows rows.
func ArgmaxScratchBytes(rows int) int64 { return int64(rows) * (4 + argmaxWideBlocks*8) }

// ArgmaxWide is Argmax spread over up to 128 blocks per row (one block reads
// a row at a fraction of the memory rate), with identical results. scratch
// holds ArgmaxScratchBytes(rows) bytes, zeroed before its first use; the
// kernel leaves it zeroed again, so it can be reused and replayed in a graph,
// but not by two launches in flight at once.
func (k *Set) ArgmaxWide(s cuda.Stream, out, val, x, scratch cuda.DevPtr, rows, n, ld int) error {
	if rows <= 0 || n <= 0 || ld < n || scratch == 0 {
		return errors.Newf("argmax wide: rows=%d n=%d ld=%d scratch=%#x", rows, n, ld, uint64(scratch))
	}
	nb := min(argmaxWideBlocks, max(1, cdiv(n, 256*8)))
	cnt := scratch
	pv := scratch.Add(int64(4 * rows))
	pi := pv.Add(int64(4 * rows * nb))
	return k.launch("argmax_wide", cuda.D3(nb, rows, 1), cuda.D1(256), 0, s, x, n, ld, out, val, cnt, pv, pi)
}

// SamplingParams controls Sample. Temperature <= 0 means greedy; TopK <= 0,
// TopP >= 1 and MinP <= 0 disable those filters. Row r draws with counter
// Step+r.
type SamplingParams struct {
	Temperature float32
	TopK        int
	TopP        float32
	MinP        float32
	Seed        uint64
	Step        uint64
	// StepAt, when set (SampleWide only), adds the int32 there to Step: a
	// row's position uploaded with the step, so that a captured step's
	// graph replays with the counter moving on.
	StepAt cuda.DevPtr
}

// Sample draws one token per row of logits [rows][ld] into out (int32).
func (k *Set) Sample(s cuda.Stream, out, logits cuda.DevPtr, rows, n, ld int, p SamplingParams) error {
	if rows <= 0 || n <= 0 || ld < n || p.StepAt != 0 {
		return errors.Newf("sample: rows=%d n=%d ld=%d step at %#x (SampleWide reads a counter on the device)", rows, n, ld, uint64(p.StepAt))
	}
	topP := p.TopP
	if topP <= 0 {
		topP = 1
	}
	return k.launch("sample_rows", cuda.D1(rows), cuda.D1(1024), 0, s, logits, n, ld, out, p.Temperature, p.TopK, topP, p.MinP, p.Seed, p.Step)
}

// sampleWideBlocks bounds SampleWide's blocks a row (cu/sample_wide.cu
// SW_MAXB), sampleWideRowBytes is its scratch a row (SW_ROW_BYTES).
const (
	sampleWideBlocks   = 256
	sampleWideRowBytes = 8 + 64 + 2048*8 + sampleWideBlocks*8
)

// sampleWidePer is the logits a block of SampleWide takes at least (512:
// 253 blocks for a 129280-token row). Session 38's timing (one H100, T 0.6
// / top-p 0.95, graph) fit a pass's cost to a + b / blocks: 47.2 us on 127
// blocks, 64.3 on 64, 101.1 on 32, 172.8 on 16, so the blocks' own loops,
// not the merge, were most of it.
var sampleWidePer = 512

// SampleScratchBytes is the scratch SampleWide needs for rows rows.
func SampleScratchBytes(rows int) int64 { return int64(rows) * sampleWideRowBytes }

// SampleWide is Sample spread over up to 256 blocks a row, a launch a pass
// (cu/sample_wide.cu): the max, three radix passes for top-k, three for
// top-p, the draw. It keeps Sample's survivors and draw, but for top-p's
// mass, summed unnormalised in fixed point (a boundary can differ where
// two tokens' masses tie within 2^-40 of the row's total). scratch holds
// SampleScratchBytes(rows) bytes, zeroed before its first use; the kernels
// leave it zeroed, so it can be reused and replayed in a graph, but not by
// two launches in flight at once.
func (k *Set) SampleWide(s cuda.Stream, out, logits, scratch cuda.DevPtr, rows, n, ld int, p SamplingParams) error {
	if rows <= 0 || n <= 0 || ld < n || scratch == 0 {
		return errors.Newf("sample wide: rows=%d n=%d ld=%d scratch=%#x", rows, n, ld, uint64(scratch))
	}
	nb := min(sampleWideBlocks, max(1, cdiv(n, sampleWidePer)))
	grid, block := cuda.D3(nb, rows, 1), cuda.D1(256)
	if !(p.Temperature > 0) {
		return k.launch("sample_wide_draw", grid, block, 0, s, logits, n, ld, scratch, out, p.Temperature, p.MinP, p.Seed, p.Step, p.StepAt)
	}
	topP := p.TopP
	if topP <= 0 {
		topP = 1
	}
	if err := k.launch("sample_wide_max", grid, block, 0, s, logits, n, ld, p.TopK, scratch); err != nil {
		return err
	}
	for mode, on := range []bool{p.TopK > 0 && p.TopK < n, topP < 1} {
		if !on {
			continue
		}
		for _, shift := range []int{21, 10, 0} {
			if err := k.launch("sample_wide_hist", grid, block, 0, s, logits, n, ld, scratch, shift, mode, p.Temperature, p.MinP, topP); err != nil {
				return err
			}
		}
	}
	return k.launch("sample_wide_draw", grid, block, 0, s, logits, n, ld, scratch, out, p.Temperature, p.MinP, p.Seed, p.Step, p.StepAt)
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}
