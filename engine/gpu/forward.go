package gpu

import (
	"encoding/binary"
	"math"

	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/cuda"
	"github.com/tilert-go/tilert/cuda/kernels"
	"github.com/tilert-go/tilert/engine"
)

// subEps is the epsilon of q_a_layernorm and kv_a_layernorm (HF builds them
// with the RMSNorm default, not config.rms_norm_eps); indexerNormEps is the
// indexer k_norm LayerNorm's. Both as in the CPU engine.
const (
	subEps         = 1e-6
	indexerNormEps = 1e-6
)

// fptr offsets a float32 device pointer by n elements.
func fptr(p cuda.DevPtr, n int) cuda.DevPtr { return p.Add(4 * int64(n)) }

// ops wraps a backend and keeps the first error, so the forward reads as a
// straight list of launches.
type ops struct {
	b   device
	err error
	// parts: the bf16/fp16 parts of x in this forward's GEMMs (backend
	// gemmParts, set by beginMeta; 0 reads as 3).
	parts int
}

// gemmParts is o.parts, 3 where unset.
func (o *ops) gemmParts() int {
	if o.parts == 0 {
		return 3
	}
	return o.parts
}

func (o *ops) do(err error) {
	if o.err == nil && err != nil {
		o.err = err
	}
}

// lin computes y = x W^T for M rows: GEMVs of at most kernels.MaxTileM
// rows at a time (the weights are read once per launch), a tensor-core GEMM
// from gemmMinRows rows (gemm.go).
func (o *ops) lin(l dlin, y, x cuda.DevPtr, M, ldx, ldy int) {
	if useGemm(l, M) {
		if l.kind == linFP8 {
			o.do(o.b.gemmFP8(y, x, l.w, l.s, l.out, l.in, M, ldx, ldy, o.gemmParts()))
		} else {
			o.do(o.b.gemmBF16(y, x, l.w, l.out, l.in, M, ldx, ldy, o.gemmParts()))
		}
		return
	}
	for r := 0; r < M && o.err == nil; r += kernels.MaxTileM {
		m := min(kernels.MaxTileM, M-r)
		yy, xx := fptr(y, r*ldy), fptr(x, r*ldx)
		switch l.kind {
		case linFP8:
			o.do(o.b.gemvFP8(yy, xx, l.w, l.s, l.out, l.in, m, ldx, ldy))
		case linBF16:
			o.do(o.b.gemvBF16(yy, xx, l.w, l.out, l.in, m, ldx, ldy))
		default:
			o.do(o.b.gemvF32(yy, xx, l.w, l.out, l.in, m, ldx, ldy))
		}
	}
}

func (o *ops) copyRow(dst, src cuda.DevPtr, row, n int) {
	o.do(o.b.copyDD(dst, fptr(src, row*n), int64(4*n)))
}

// workspace holds the forward's activations for up to maxRows rows.
type workspace struct {
	meta                     cuda.DevPtr // int32: ids [maxRows], pos [maxRows], lens [maxRows], pad; then int64 row bases [maxRows] (the row's slot buffer)
	meta2                    cuda.DevPtr // meta's twin: forwards alternate between them where aheadCopyOn (beginMeta)
	x, h, tmp, mo, hid, mhid cuda.DevPtr // [rows][hidden]
	hin                      cuda.DevPtr // MTP input hidden [rows][hidden]
	cat                      cuda.DevPtr // [rows][2*hidden]
	qa, q, kva               cuda.DevPtr
	qlat, qpe, olat, ao      cuda.DevPtr
	iq, ik, iw, scores, topk cuda.DevPtr
	iqh, iwq                 cuda.DevPtr // indexerQPrep's query codes [rows][kernels.IndexerQRowBytes] and weights [rows][64]
	g, u                     cuda.DevPtr // [rows][max intermediate]
	rlog, eidx, ewts         cuda.DevPtr
	uq                       cuda.DevPtr // int32: kernels.MoEUnique's table (moe_unique.go)
	osk, ones                cuda.DevPtr // a one-row o_proj's split-K partials [kernels.SplitKMax][hidden] and their weights (osplit.go)
	eg, eu, ey               cuda.DevPtr // [top-k][moe intermediate or hidden]
	logits, tok              cuda.DevPtr
	amax                     cuda.DevPtr // arg-max scratch (kernels.ArgmaxScratchBytes(maxRows))
	samp                     cuda.DevPtr // sampler scratch (kernels.SampleScratchBytes(1): one pick at a time)
	mla                      cuda.DevPtr // split MLA partials (kernels.MLAHeadsWorkspaceBytes(maxRows, heads))
	tkw                      cuda.DevPtr // top-k scratch (kernels.TopKRadixScratchBytes(maxRows, ldScores), zeroed)
	qss                      cuda.DevPtr // q_a's per-block sums of squares, TILERT_GPU_QA_NORM=late ([q_lora_rank]: at most a block a row)
	grp                      moeGroupWorkspace
	ldScores                 int
}

func newWorkspace(e *backend, b device) (*workspace, error) {
	ws := &workspace{ldScores: e.maxSeq}
	var err error
	for _, a := range ws.bufs(e, e.maxRows) {
		if err == nil {
			*a.p, err = e.alloc(b, int64(4*max(a.n, 1)))
		}
		if err == nil {
			// Zeroed: no buffer ever holds stale NaN patterns.
			err = b.zero(*a.p, int64(4*max(a.n, 1)))
		}
	}
	if err == nil {
		err = b.upload(ws.ones, splitOnes())
	}
	if err == nil {
		err = ws.allocGroup(e, b, e.maxRows)
	}
	if err == nil {
		err = e.allocGemmScratch(b, e.maxRows)
	}
	return ws, err
}

// wsBuf is one workspace buffer: where its pointer goes and its float32s.
type wsBuf struct {
	p *cuda.DevPtr
	n int
}

// bufs lists the workspace's buffers for M rows (newWorkspace allocates
// them; workspaceBytes adds them up to size the prefill chunk).
func (ws *workspace) bufs(e *backend, M int) []wsBuf {
	c := e.cfg
	H, NH := c.HiddenSize, c.NumHeads
	qk := c.QKNopeHeadDim + c.QKRopeHeadDim
	R, P := c.KVLoraRank, c.QKRopeHeadDim
	inter := c.IntermediateSize
	if c.NSharedExperts > 0 {
		inter = max(inter, c.MoEIntermediateSize*c.NSharedExperts)
	}
	K := max(1, c.NumExpertsPerTok)
	// The tile MoE runs up to MaxTileM rows' slots plus their shared
	// expert rows per launch.
	tileSlots := min(M, kernels.MaxTileM) * (K + 1)
	bs := []wsBuf{{&ws.meta, 6 * M}, {&ws.meta2, 6 * M}}
	for _, p := range []*cuda.DevPtr{&ws.x, &ws.h, &ws.tmp, &ws.mo, &ws.hid, &ws.mhid, &ws.hin} {
		bs = append(bs, wsBuf{p, M * H})
	}
	bs = append(bs, []wsBuf{
		{&ws.cat, M * 2 * H},
		{&ws.qa, M * c.QLoraRank},
		{&ws.qss, c.QLoraRank},
		{&ws.q, M * NH * qk},
		{&ws.kva, M * (R + P)},
		{&ws.qlat, M * NH * R},
		{&ws.qpe, M * NH * P},
		{&ws.olat, M * NH * R},
		{&ws.ao, M * NH * c.VHeadDim},
		{&ws.iq, M * c.IndexNHeads * c.IndexHeadDim},
		{&ws.ik, M * c.IndexHeadDim},
		{&ws.iw, M * c.IndexNHeads},
		{&ws.scores, M * ws.ldScores},
		{&ws.topk, M * c.IndexTopK},
		{&ws.g, M * inter},
		{&ws.u, M * inter},
		{&ws.rlog, M * max(1, c.NRoutedExperts)},
		{&ws.eidx, M * K},
		{&ws.ewts, M * K},
		{&ws.uq, uniqueTableInts(c, M)},
		{&ws.osk, kernels.SplitKMax * H},
		{&ws.ones, kernels.SplitKMax},
		{&ws.eg, max(K, tileSlots) * max(1, c.MoEIntermediateSize)},
		{&ws.eu, K * max(1, c.MoEIntermediateSize)},
		{&ws.ey, max(K, tileSlots) * H},
		{&ws.logits, M * c.VocabSize},
		{&ws.tok, M},
		{&ws.amax, int(kernels.ArgmaxScratchBytes(M) / 4)},
		{&ws.samp, int(kernels.SampleScratchBytes(1) / 4)},
		{&ws.mla, int(mlaWorkspaceBytes(M, NH) / 4)},
		{&ws.tkw, int(kernels.TopKRadixScratchBytes(M, ws.ldScores) / 4)},
	}...)
	if e.idxQ() {
		bs = append(bs, wsBuf{&ws.iqh, M * kernels.IndexerQRowBytes / 4}, wsBuf{&ws.iwq, M * kernels.IndexerQHeads})
	}
	return bs
}

// workspaceBytes is the device memory newWorkspace takes for M rows
// (the grouped MoE's buffers and the one-part GEMM scratch included).
func workspaceBytes(e *backend, M int) int64 {
	ws := &workspace{ldScores: e.maxSeq}
	var n int64
	for _, a := range ws.bufs(e, M) {
		n += int64(4 * max(a.n, 1))
	}
	n += groupBytes(e.cfg, M)
	if e.gemmScratchOn() && M >= gemmMinRows {
		n += gemmScratchBytes(e.cfg, M)
	}
	return n
}

// fwdRow is one position forwarded: token tok of slot s at position pos.
type fwdRow struct {
	s        *slot
	tok, pos int
}

// group is a run of consecutive rows of one slot (consecutive positions):
// cache writes, the indexer and attention run per group on that slot's
// cache regions.
type group struct {
	s            *slot
	first, n     int
	maxLen, last int
}

// begin uploads rows' ids, positions and lengths and groups them per
// slot: the state of one forward (nil after an error).
func (e *backend) begin(o *ops, rows []fwdRow) *fwd { return e.beginMeta(o, rows, nil, nil) }

// beginMeta is begin; with pin set (host memory from hostAlloc, 6*4*maxRows
// bytes, not reused before the upload has run) the meta goes up from pin
// and row i's token id, where from[i] >= 0, is copied on the device from
// ws.tok[from[i]], where the last pick left it (the forward started ahead,
// ahead.go).
func (e *backend) beginMeta(o *ops, rows []fwdRow, pin []byte, from []int) *fwd {
	if o.err != nil {
		return nil
	}
	o.parts = e.gemmParts()
	ws := e.ws
	M := len(rows)
	if M == 0 || M > e.maxRows {
		o.do(errors.Newf("forward of %d rows (at most %d)", M, e.maxRows))
		return nil
	}
	// The row bases (for the launches across slots) only when those run:
	// otherwise the upload is the ids, positions and lengths alone.
	n := 3 * 4 * e.maxRows
	if slotMergeOn {
		n = 6 * 4 * e.maxRows
	}
	meta := pin
	if meta == nil {
		meta = make([]byte, n)
	} else {
		meta = meta[:n]
		clear(meta)
	}
	var groups []group
	for i, r := range rows {
		binary.LittleEndian.PutUint32(meta[4*i:], uint32(r.tok))
		binary.LittleEndian.PutUint32(meta[4*(e.maxRows+i):], uint32(r.pos))
		binary.LittleEndian.PutUint32(meta[4*(2*e.maxRows+i):], uint32(r.pos+1))
		if slotMergeOn {
			binary.LittleEndian.PutUint64(meta[4*(4*e.maxRows)+8*i:], uint64(r.s.buf))
		}
		if n := len(groups); n > 0 && groups[n-1].s == r.s && r.pos == groups[n-1].last+1 {
			groups[n-1].n++
			groups[n-1].last = r.pos
			groups[n-1].maxLen = max(groups[n-1].maxLen, r.pos+1)
			continue
		}
		groups = append(groups, group{s: r.s, first: i, n: 1, maxLen: r.pos + 1, last: r.pos})
	}
	o.parts = forwardParts(o.parts, groups)
	dm := ws.meta
	if aheadCopyOn {
		// The twin the last forward did not use (the forward before last
		// did): the upload goes beside the main stream while the last
		// forward may still read its own.
		if e.metaCur == ws.meta {
			dm = ws.meta2
		}
		o.do(o.b.uploadBeside(dm, meta))
	} else {
		o.do(o.b.upload(dm, meta))
	}
	e.metaCur = dm
	e.rowPos = e.rowPos[:0]
	for _, r := range rows {
		e.rowPos = append(e.rowPos, r.pos)
	}
	ids, pos, lens := dm, fptr(dm, e.maxRows), fptr(dm, 2*e.maxRows)
	if p, ok := picksInPlace(from, M); ok && aheadCopyOn {
		// Every row's token is a pick, in order: the embedding reads them
		// where the picks wrote them (nothing writes ws.tok before the
		// next picks, behind this forward), so nothing is copied.
		ids, from = fptr(ws.tok, p), nil
	}
	for i := 0; i < len(from); {
		if from[i] < 0 {
			i++
			continue
		}
		k := i + 1 // a run of consecutive picks: one copy
		for k < len(from) && from[k] == from[k-1]+1 {
			k++
		}
		o.do(o.b.copyDD(fptr(ids, i), fptr(ws.tok, from[i]), int64(4*(k-i))))
		i = k
	}
	return &fwd{e: e, o: o, M: M, groups: groups, ids: ids, pos: pos, lens: lens, bases: fptr(dm, 4*e.maxRows)}
}

// picksInPlace says whether from (beginMeta's: row i's token is pick
// from[i], -1 the row's own) gives each of the M rows a pick, the picks
// consecutive from p.
func picksInPlace(from []int, M int) (p int, ok bool) {
	if len(from) != M || M == 0 || from[0] < 0 {
		return 0, false
	}
	for i, j := range from {
		if j != from[0]+i {
			return 0, false
		}
	}
	return from[0], true
}

// forward runs rows through the main layers (mtp false) or the MTP layer
// (mtp true, with ws.hin holding each row's previous final-normed hidden).
// The final-normed hidden lands in ws.hid (main) or ws.mhid (MTP), the
// logits of rows with want[i] (nil: all) in ws.logits. As in the CPU
// engine, every row's caches are written before any row attends, and a row
// attends only to positions <= its own.
func (e *backend) forward(o *ops, rows []fwdRow, mtp bool, want []bool) {
	e.forwardFrom(e.begin(o, rows), mtp, want)
}

// forwardFrom is forward after begin (nil f: nothing to run).
func (e *backend) forwardFrom(f *fwd, mtp bool, want []bool) {
	if f == nil {
		return
	}
	o := f.o
	c := e.cfg
	ws := e.ws
	M, H := f.M, c.HiddenSize
	layers, hid, norm, head := f.input(mtp)
	if m := o.b.prioMode(); m != prioOff {
		late, _ := f.qLate()
		o.do(o.b.raise(stepRaised(m, M, late, f.long())))
		defer func() { o.do(o.b.raise(false)) }()
	}
	for i, lw := range layers {
		y, w := hid, norm
		if i+1 < len(layers) {
			y, w = ws.h, layers[i+1].InNorm
		}
		f.block(lw, y, w)
	}

	V := c.VocabSize
	if a, n, ok := headSpan(want, M); ok {
		o.lin(head, fptr(ws.logits, a*V), fptr(hid, a*H), n, H, V)
		return
	}
	for i, w := range want {
		if w {
			o.lin(head, fptr(ws.logits, i*V), fptr(hid, i*H), 1, H, V)
		}
	}
}

// headSpanMax bounds the rows headSpan gives the head in one launch.
const headSpanMax = 16

// headSpan says which rows get the head's logits in one launch: all M
// where want is nil, else the span from the first wanted row to the last
// where it has at most headSpanMax rows (rows between two wanted ones get
// logits nobody reads: the weights, 1.85 GB of bf16 head on DeepSeek-V3.2,
// are read once either way). ok false: one launch per wanted row (a
// prefill's last row out of thousands, or no row wanted). Until session 46
// every non-nil want took a launch per row, so a 4-slot MTP forward read
// the head four times (1.9 ms of a 7.95 ms step on an H100).
func headSpan(want []bool, M int) (a, n int, ok bool) {
	if want == nil {
		return 0, M, true
	}
	a, b := -1, -1
	for i, w := range want {
		if w {
			if a < 0 {
				a = i
			}
			b = i
		}
	}
	if a < 0 || b-a+1 > headSpanMax {
		return 0, 0, false
	}
	return a, b - a + 1, true
}

// input embeds the rows (main) or builds the MTP layer's input from the
// embedding and ws.hin, leaving the residual in ws.x and its input norm in
// ws.h; it returns the layers to run, where the final hidden goes, the
// final norm and the head.
func (f *fwd) input(mtp bool) (layers []*dlayer, hid, norm cuda.DevPtr, head dlin) {
	e, o, ws := f.e, f.o, f.e.ws
	c := e.cfg
	M, H := f.M, c.HiddenSize
	hid, norm, head = ws.hid, e.w.norm, e.w.head
	if mtp {
		lw := e.w.layers[c.NumLayers]
		layers = []*dlayer{lw}
		hid, norm, head = ws.mhid, lw.ShNorm, lw.head
		// x = eh_proj(cat(enorm(embed(tok)), hnorm(h_prev)))
		o.do(o.b.embed(ws.h, lw.embed, f.ids, M, H, c.VocabSize))
		eps := float32(c.RMSNormEps)
		o.do(o.b.rmsnorm(ws.cat, ws.h, lw.ENorm, M, H, H, 2*H, eps))
		o.do(o.b.rmsnorm(fptr(ws.cat, H), ws.hin, lw.HNorm, M, H, H, 2*H, eps))
		o.lin(lw.EH, ws.x, ws.cat, M, 2*H, H)
	} else {
		layers = e.w.layers[:c.NumLayers]
		o.do(o.b.embed(ws.x, e.w.embed, f.ids, M, H, c.VocabSize))
	}
	// Each block ends with its residual add fused into the next norm: the
	// next block's input norm, or the final norm after the last.
	o.do(o.b.rmsnorm(ws.h, ws.x, layers[0].InNorm, M, H, H, H, float32(c.RMSNormEps)))
	return layers, hid, norm, head
}

// fwd is one forward's state.
type fwd struct {
	e              *backend
	o              *ops
	M              int
	groups         []group
	ids, pos, lens cuda.DevPtr
	bases          cuda.DevPtr // int64 per row: its slot's buffer (the *Rows launches)
	// idxKW, idxQB: attnProj's grouped launches already wrote this layer's
	// indexer keys and head weights (ik, iw), its query (iq); qaRaw: they
	// left ws.qa unnormed.
	idxKW, idxQB, qaRaw bool
	// qaScale: the layer-input group left q_a times its norm weight in
	// ws.qa and its sums of squares in ws.qss (TILERT_GPU_QA_NORM=late,
	// qa_norm.go); absorbQ applies RMSNorm's scale.
	qaScale kernels.QScale
	// sideQ: q_b and the query absorption run on the side stream, joined
	// before the MLA (side.go); sideSh: the shared expert does, joined
	// before the MoE's combine.
	sideQ, sideSh bool
	// qPending: q_b and the query absorption wait for the indexer's scores
	// launch, to fork beside its top-k (qLate); attnOut runs them in line
	// if nothing forked them.
	// qBefore: it forks right before the scores launch instead (qLate).
	qPending, qBefore bool
	// closeY, closeW: the norm that closes the layer (block's nextY,
	// nextW) while its MoE runs; closed: moeTile ran it, fused into the
	// combine (moeNormOn).
	closeY, closeW cuda.DevPtr
	closed         bool
	// oSplit: block's o_proj runs as that many split-K slices into ws.osk
	// (osplit.go), summed by the post-attention norm's launch; 0: one GEMV.
	oSplit int
}

// block runs one layer over ws.h (the input-normed residual ws.x) and
// leaves x + attention + mlp in ws.x and its norm by nextW in nextY.
func (f *fwd) block(lw *dlayer, nextY, nextW cuda.DevPtr) {
	e, o, ws := f.e, f.o, f.e.ws
	c := e.cfg
	H, M := c.HiddenSize, f.M
	eps := float32(c.RMSNormEps)
	f.oSplit = f.oSplitSlices(lw)
	f.attention(lw)
	if f.oSplit > 0 {
		// attnProjOut left o_proj's slices in ws.osk: their sum is ws.tmp.
		o.do(o.b.moeCombineNorm(ws.h, ws.x, ws.tmp, ws.osk, ws.ones, 0, lw.PostNorm, M, f.oSplit, H, eps))
		f.oSplit = 0
	} else {
		o.do(o.b.addRMSNorm(ws.h, ws.x, ws.tmp, lw.PostNorm, M, H, H, H, H, eps))
	}
	f.closed = false
	if lw.MoE {
		f.closeY, f.closeW = nextY, nextW
		f.moe(lw)
		f.closeY, f.closeW = 0, 0
	} else {
		f.ffn(lw.Gate, lw.Up, lw.Down, ws.mo)
	}
	if !f.closed {
		o.do(o.b.addRMSNorm(nextY, ws.x, ws.mo, nextW, M, H, H, H, H, eps))
	}
}

// ffn writes down(silu(gate h) * up h) of ws.h into out.
func (f *fwd) ffn(g, u, d dlin, out cuda.DevPtr) {
	o, ws := f.o, f.e.ws
	H, M, I := f.e.cfg.HiddenSize, f.M, g.out
	if tileFFN(g, u) && !useGemm(g, M) {
		// gate, up and SwiGLU in one launch per MaxTileM rows
		for r := 0; r < M && o.err == nil; r += kernels.MaxTileM {
			o.do(o.b.gateUp(fptr(ws.g, r*I), fptr(ws.h, r*H), g.w, g.s, u.w, u.s, I, H, min(kernels.MaxTileM, M-r), H, I))
		}
	} else {
		o.lin(g, ws.g, ws.h, M, H, I)
		o.lin(u, ws.u, ws.h, M, H, I)
		o.do(o.b.siluMul(ws.g, ws.g, ws.u, M, I, I, I, I))
	}
	o.lin(d, out, ws.g, M, I, H)
}

// tileFFN says whether gate and up run as one tile launch: fp8 weights of
// one shape whose rows are whole 16-byte chunks.
func tileFFN(g, u dlin) bool {
	return gemvTileOn && g.kind == linFP8 && u.kind == linFP8 && g.out == u.out && g.in == u.in && g.in%16 == 0
}

// moe writes the routed experts' weighted sum plus the shared expert of
// ws.h into ws.mo; expert ids stay on the device.
func (f *fwd) moe(lw *dlayer) {
	c := f.e.cfg
	H := c.HiddenSize
	f.sideSh = f.sharedBeside(lw)
	f.route(lw)
	switch {
	case f.groupedMoE():
		f.moeGrouped(lw) // the shared expert included
	case gemvTileOn && H%16 == 0 && c.MoEIntermediateSize%16 == 0:
		f.moeTile(lw) // the shared expert included
	default:
		f.moeRows(lw)
		if lw.HasShared {
			f.addSharedFFN(lw)
		}
	}
}

// route runs the router GEMV and the routing of ws.h into ws.eidx and
// ws.ewts.
func (f *fwd) route(lw *dlayer) {
	e, o, ws := f.e, f.o, f.e.ws
	c := e.cfg
	H, M := c.HiddenSize, f.M
	E, K := c.NRoutedExperts, c.NumExpertsPerTok
	o.lin(lw.Router, ws.rlog, ws.h, M, H, E)
	o.do(o.b.moeRoute(ws.eidx, ws.ewts, ws.rlog, lw.Bias, M, E, K, c.NGroup, c.TopKGroup, c.NormTopKProb, float32(c.RoutedScalingFactor)))
	if d, ok := e.probe.slot(lw.Idx, M, K); ok {
		o.do(o.b.copyDD(d, ws.eidx, int64(4*M*K)))
	}
}

// tileShared says whether moeTile runs the shared expert as dense slots of
// its expert launches: it has the routed experts' shape.
func (f *fwd) tileShared(lw *dlayer) bool {
	H, MI := f.e.cfg.HiddenSize, f.e.cfg.MoEIntermediateSize
	return lw.HasShared && tileFFN(lw.ShGate, lw.ShUp) && lw.ShGate.out == MI && lw.ShDown.kind == linFP8 &&
		lw.ShDown.in == MI && lw.ShDown.out == H
}

// sharedBeside queues the shared expert's gate/up and down of ws.h on the
// side stream (side.go), beside the router and the routing, when moeTile
// will take the layer in one round of launches; moeTile then runs the
// routed slots alone and joins. The launches are shaped as the one over
// all slots, so every output keeps its bits. It says whether it did.
func (f *fwd) sharedBeside(lw *dlayer) bool {
	if !sideShOn || !f.moeForkOK(lw) {
		return false
	}
	o := f.o
	o.do(o.b.fork(chainSh, f.M))
	f.sharedShaped(lw)
	o.do(o.b.unfork())
	return true
}

// moeForkOK says whether the MoE half may fork: one round of tile
// launches and the shared expert of the routed shape.
func (f *fwd) moeForkOK(lw *dlayer) bool {
	c := f.e.cfg
	H, M := c.HiddenSize, f.M
	MI := c.MoEIntermediateSize
	return M <= kernels.MaxTileM && !f.groupedMoE() && gemvTileOn && H%16 == 0 && MI%16 == 0 &&
		f.tileShared(lw)
}

// sharedShaped queues the shared expert's gate/up and down of ws.h as
// moeTile's launch over all slots would run them (so the same bits).
func (f *fwd) sharedShaped(lw *dlayer) {
	e, o, ws := f.e, f.o, f.e.ws
	c := e.cfg
	H, M := c.HiddenSize, f.M
	K, MI := c.NumExpertsPerTok, c.MoEIntermediateSize
	slots := M * K
	if f.sharedOnce(M) {
		// Its weights once for all M rows (the dense FFN's launches), not a
		// dense slot a row: other bits than moeTile's launch gives them.
		o.do(o.b.gateUp(fptr(ws.eg, slots*MI), ws.h, lw.ShGate.w, lw.ShGate.s, lw.ShUp.w, lw.ShUp.s, MI, H, M, H, MI))
		o.do(o.b.gemvFP8(fptr(ws.ey, slots*H), fptr(ws.eg, slots*MI), lw.ShDown.w, lw.ShDown.s, H, MI, M, MI, H))
		return
	}
	o.do(o.b.expertsShaped(fptr(ws.eg, slots*MI), ws.h, H, K, 0, [2]cuda.DevPtr{}, [2]cuda.DevPtr{}, 0, 0,
		[2]cuda.DevPtr{lw.ShGate.w, lw.ShUp.w}, [2]cuda.DevPtr{lw.ShGate.s, lw.ShUp.s}, M, MI, H, slots+M))
	o.do(o.b.expertsShaped(fptr(ws.ey, slots*H), ws.eg, MI, 1, slots, [2]cuda.DevPtr{}, [2]cuda.DevPtr{}, 0, 0,
		[2]cuda.DevPtr{lw.ShDown.w}, [2]cuda.DevPtr{lw.ShDown.s}, M, H, MI, slots+M))
}

// addSharedFFN adds the shared expert of ws.h, run as a dense FFN, to ws.mo.
func (f *fwd) addSharedFFN(lw *dlayer) {
	ws := f.e.ws
	f.ffn(lw.ShGate, lw.ShUp, lw.ShDown, ws.tmp)
	f.o.do(f.o.b.add(ws.mo, ws.mo, ws.tmp, f.M*f.e.cfg.HiddenSize))
}

// moeRows runs the routed experts of ws.eidx row by row into ws.mo (expert
// ids stay on the device, so a decode step can be captured in a graph).
func (f *fwd) moeRows(lw *dlayer) {
	e, o, ws := f.e, f.o, f.e.ws
	c := e.cfg
	H, M := c.HiddenSize, f.M
	K, MI := c.NumExpertsPerTok, c.MoEIntermediateSize
	for m := 0; m < M; m++ {
		hx := fptr(ws.h, m*H)
		ids := fptr(ws.eidx, m*K)
		o.do(o.b.gemvExperts(ws.eg, hx, 0, lw.expW[0], lw.expS[0], ids, K, MI, H))
		o.do(o.b.gemvExperts(ws.eu, hx, 0, lw.expW[1], lw.expS[1], ids, K, MI, H))
		o.do(o.b.siluMul(ws.eg, ws.eg, ws.eu, K, MI, MI, MI, MI))
		o.do(o.b.gemvExperts(ws.ey, ws.eg, MI, lw.expW[2], lw.expS[2], ids, K, H, MI))
		o.do(o.b.moeCombine(fptr(ws.mo, m*H), ws.ey, fptr(ws.ewts, m*K), 0, K, H))
	}
}

// moeTile runs the experts of up to MaxTileM rows per three launches:
// gate/up/SwiGLU of every routed slot and the shared expert (a dense slot
// per row), down likewise, and the weighted combine with the shared
// expert's output added (routed sum first, then the shared expert, as the
// per-row path adds them).
func (f *fwd) moeTile(lw *dlayer) {
	e, o, ws := f.e, f.o, f.e.ws
	c := e.cfg
	H, M := c.HiddenSize, f.M
	K, MI := c.NumExpertsPerTok, c.MoEIntermediateSize
	// The shared expert rides along when it has the routed experts' shape
	// (in its own launches on the side stream when sideSh).
	shared := f.tileShared(lw)
	beside := f.sideSh
	f.sideSh = false
	for r := 0; r < M && o.err == nil; r += kernels.MaxTileM {
		m := min(kernels.MaxTileM, M-r)
		slots, dense := m*K, 0
		var gw, gs, dw, ds [2]cuda.DevPtr
		if shared {
			dense = m
			gw, gs = [2]cuda.DevPtr{lw.ShGate.w, lw.ShUp.w}, [2]cuda.DevPtr{lw.ShGate.s, lw.ShUp.s}
			dw, ds = [2]cuda.DevPtr{lw.ShDown.w}, [2]cuda.DevPtr{lw.ShDown.s}
		}
		ids := fptr(ws.eidx, r*K)
		if beside {
			// The shared expert's rows are already on the side stream
			// (sharedBeside): the routed slots alone, shaped as the launch
			// with them, then the join; grouped by expert where several
			// rows share a launch (moe_unique.go).
			if f.moeUnique(m) {
				mmax, mma := kernels.UniqueGroupSlots(m), f.moeUniqueMMA()
				o.do(o.b.moeUnique(ws.uq, ids, slots, mmax))
				o.do(o.b.expertsUnique(ws.eg, fptr(ws.h, r*H), H, K, [2]cuda.DevPtr{lw.expW[0], lw.expW[1]},
					[2]cuda.DevPtr{lw.expS[0], lw.expS[1]}, ws.uq, slots, m, MI, H, slots+dense, mma))
				o.do(o.b.expertsUnique(ws.ey, ws.eg, MI, 1, [2]cuda.DevPtr{lw.expW[2]}, [2]cuda.DevPtr{lw.expS[2]}, ws.uq, slots, m,
					H, MI, slots+dense, mma))
			} else {
				o.do(o.b.expertsShaped(ws.eg, fptr(ws.h, r*H), H, K, 0, [2]cuda.DevPtr{lw.expW[0], lw.expW[1]},
					[2]cuda.DevPtr{lw.expS[0], lw.expS[1]}, ids, slots, [2]cuda.DevPtr{}, [2]cuda.DevPtr{}, 0, MI, H, slots+dense))
				o.do(o.b.expertsShaped(ws.ey, ws.eg, MI, 1, slots, [2]cuda.DevPtr{lw.expW[2]}, [2]cuda.DevPtr{lw.expS[2]}, ids, slots,
					[2]cuda.DevPtr{}, [2]cuda.DevPtr{}, 0, H, MI, slots+dense))
			}
			o.do(o.b.join())
		} else {
			o.do(o.b.experts(ws.eg, fptr(ws.h, r*H), H, K, 0, [2]cuda.DevPtr{lw.expW[0], lw.expW[1]}, [2]cuda.DevPtr{lw.expS[0], lw.expS[1]},
				ids, slots, gw, gs, dense, MI, H))
			o.do(o.b.experts(ws.ey, ws.eg, MI, 1, slots, [2]cuda.DevPtr{lw.expW[2]}, [2]cuda.DevPtr{lw.expS[2]}, ids, slots, dw, ds, dense, H, MI))
		}
		resid := cuda.DevPtr(0)
		if shared {
			resid = fptr(ws.ey, slots*H)
		}
		if f.closeNorm(lw, shared) {
			// The combine is the layer's last op: block's closing add and
			// norm fused into it (the same place, after the side join).
			o.do(o.b.moeCombineNorm(f.closeY, ws.x, ws.mo, ws.ey, ws.ewts, resid, f.closeW, m, K, H, float32(c.RMSNormEps)))
			f.closed = true
			continue
		}
		o.do(o.b.moeCombineSlots(fptr(ws.mo, r*H), ws.ey, fptr(ws.ewts, r*K), resid, m, K, H))
	}
	if lw.HasShared && !shared {
		f.addSharedFFN(lw)
	}
}

// closeNorm says whether moeTile's combine runs with block's closing add
// and norm (moeCombineNorm): switched on, block asked for it (f.closeY),
// one round of rows (the combine is then the MoE's last launch), and no
// shared expert left to add after it.
func (f *fwd) closeNorm(lw *dlayer, shared bool) bool {
	return moeNormOn && f.closeY != 0 && f.M <= kernels.MaxTileM && (shared || !lw.HasShared)
}

// attnIn computes the queries and the rows' latent cache entries (written
// into the cache) from ws.h; withIdx: the indexer runs next in this forward,
// so its projections may join the grouped launches (projGroup).
func (f *fwd) attnIn(lw *dlayer, withIdx bool) {
	f.attnProj(lw, withIdx)
	if f.fuseKV() {
		f.epilogue(lw, true, false)
		return
	}
	f.kvEpilogue(lw)
}

// attnProj runs attnIn's projections: normed q_a into ws.qa, q_b into ws.q,
// kv_a into ws.kva; where projGroup takes them, in grouped launches that
// may also run the indexer's projections (withIdx; indexerProj then skips
// them) and may leave q_a unnormed in ws.qa (f.qaRaw).
func (f *fwd) attnProj(lw *dlayer, withIdx bool) {
	e, o, ws := f.e, f.o, f.e.ws
	c := e.cfg
	H, M := c.HiddenSize, f.M
	R, P := c.KVLoraRank, c.QKRopeHeadDim
	NH, nope := c.NumHeads, c.QKNopeHeadDim
	qk := nope + P
	QL := c.QLoraRank

	f.qaRaw, f.idxKW, f.idxQB, f.qaScale = false, false, false, kernels.QScale{}
	if f.projGroup(lw, withIdx) {
		return
	}
	o.lin(lw.QA, ws.qa, ws.h, M, H, QL)
	o.do(o.b.rmsnorm(ws.qa, ws.qa, lw.QANorm, M, QL, QL, QL, subEps))
	o.lin(lw.QB, ws.q, ws.qa, M, QL, NH*qk)
	o.lin(lw.KVA, ws.kva, ws.h, M, H, R+P)
}

// kvEpilogue is attnIn's per-row work after the projections, unfused:
// kv_a_layernorm, RoPE and the cache write.
func (f *fwd) kvEpilogue(lw *dlayer) {
	e, o, ws := f.e, f.o, f.e.ws
	c := e.cfg
	M := f.M
	R, P := c.KVLoraRank, c.QKRopeHeadDim
	o.do(o.b.rmsnorm(ws.kva, ws.kva, lw.KVANorm, M, R, R+P, R+P, subEps))
	o.do(o.b.rope(ws.kva, f.pos, e.ropeCos, e.ropeSin, M, 1, R+P, R, P, c.RopeInterleave))
	for _, g := range f.groups {
		o.do(o.b.mlaCacheWrite(e.mla, g.s.buf.Add(e.mlaOff[lw.Idx]), fptr(ws.kva, g.first*(R+P)), fptr(f.pos, g.first), g.n, R+P))
	}
	// q's RoPE part is rotated where attnOut copies it out (absorbQ).
}

// attention is absorbed MLA with the DSA indexer over ws.h; o_proj's output
// lands in ws.tmp. Fused, every projection runs first and one launch per
// group does the latent rows' and the indexer's per-row work.
func (f *fwd) attention(lw *dlayer) {
	if f.fuseKV() && (!lw.HasIdx || f.fuseIdx()) {
		f.attnProj(lw, lw.HasIdx)
		if lw.HasIdx {
			f.indexerProj(lw)
		}
		f.epilogue(lw, true, lw.HasIdx)
		if lw.HasIdx {
			f.idxSelect(lw)
		}
	} else {
		f.attnIn(lw, lw.HasIdx)
		if lw.HasIdx {
			f.indexer(lw)
		}
	}
	f.attnOut(lw)
}

// fuseKV says whether the latent rows' norm, RoPE and cache write run as
// attnEpilogue: fp8_ds_mla caches of 512 + 64 values (exact mode and bf16
// caches keep their launches).
func (f *fwd) fuseKV() bool {
	c := f.e.cfg
	return fuseOn && f.e.mla == mlaFP8 && c.KVLoraRank == kernels.MLALatentDim && c.QKRopeHeadDim == kernels.MLARopeDim
}

// fuseIdx says whether the indexer keys' norm, RoPE, cache write and the
// query preparation run as attnEpilogue: the serving indexer on
// indexerQPrep.
func (f *fwd) fuseIdx() bool { return fuseOn && f.e.idxQ() }

// epilogue runs attnEpilogue per group: the latent rows (kv) and the
// indexer keys and query (idx) of the group's rows. With several groups
// merged (f.merge) one launch takes all rows, each writing its own slot's
// caches through the step's row bases: every other operand is already
// row-contiguous, and on the H200 (4 slots at 8192, DeepSeek-V3.2 dims) the
// per-group launches were 40 a step, ~155 us of the step's critical path.
func (f *fwd) epilogue(lw *dlayer, kv, idx bool) {
	if f.merge() && epiRowsOn {
		a := f.epilogueArgs(lw, kv, idx, group{first: 0, n: f.M})
		a.Bases = f.bases
		if kv {
			a.MLARows, a.MLAOff = true, f.e.mlaOff[lw.Idx]
		}
		if idx {
			a.IdxRows, a.IdxOff = true, f.e.idxOff[lw.Idx]
		}
		f.o.do(f.o.b.attnEpilogue(a))
		return
	}
	for _, g := range f.groups {
		a := f.epilogueArgs(lw, kv, idx, g)
		if kv {
			a.MLACache = g.s.buf.Add(f.e.mlaOff[lw.Idx])
		}
		if idx {
			a.IdxCache = g.s.buf.Add(f.e.idxOff[lw.Idx])
		}
		f.o.do(f.o.b.attnEpilogue(a))
	}
}

// epilogueArgs is attnEpilogue's launch for rows g.first..g.first+g.n
// without the caches (one cache or per-row bases: the caller's).
func (f *fwd) epilogueArgs(lw *dlayer, kv, idx bool, g group) kernels.AttnEpilogue {
	e, ws := f.e, f.e.ws
	c := e.cfg
	R, P := c.KVLoraRank, c.QKRopeHeadDim
	IH, ID := c.IndexNHeads, c.IndexHeadDim
	a := kernels.AttnEpilogue{Pos: fptr(f.pos, g.first), Cos: e.ropeCos, Sin: e.ropeSin, Rot: P, Rows: g.n}
	if kv {
		a.KVA, a.LdKV, a.KVNorm, a.KVEps = fptr(ws.kva, g.first*(R+P)), R+P, lw.KVANorm, subEps
		a.KVInterleaved = c.RopeInterleave
	}
	if idx {
		a.IK, a.LdIK, a.IKNormW, a.IKNormB, a.IKEps = fptr(ws.ik, g.first*ID), ID, lw.IKNormW, lw.IKNormB, indexerNormEps
		a.IdxInterleaved = c.IndexerRopeInterleave
		a.IQ, a.IW, a.IH, a.WScale = fptr(ws.iq, g.first*IH*ID), fptr(ws.iw, g.first*IH), IH, f.idxWScale()
		a.QH, a.WQ = ws.iqh.Add(int64(g.first*kernels.IndexerQRowBytes)), fptr(ws.iwq, g.first*kernels.IndexerQHeads)
		a.QS = f.qaScale // wq_b ran on q_a times its norm weight (TILERT_GPU_QA_NORM=late)
	}
	return a
}

// merge says whether the attention kernels run once for the rows of all
// slots (TILERT_GPU_SLOT_MERGE=1 and more than one slot in the step).
func (f *fwd) merge() bool { return slotMergeOn && len(f.groups) > 1 }

// idxWScale is the factor indexerQPrep folds into the head weights:
// H^-0.5 times the softmax scale.
func (f *fwd) idxWScale() float32 {
	c := f.e.cfg
	return float32(math.Pow(float64(c.IndexNHeads), -0.5)) * float32(c.IndexerSoftmaxScale())
}

// attnOut attends with the selection in ws.topk and projects through
// o_proj into ws.tmp.
func (f *fwd) attnOut(lw *dlayer) {
	e, o, ws := f.e, f.o, f.e.ws
	c := e.cfg
	M := f.M
	R, P := c.KVLoraRank, c.QKRopeHeadDim
	NH := c.NumHeads
	TK := c.IndexTopK
	switch {
	case f.qPending:
		// No scores launch forked them (rows within index_topk).
		f.qPending, f.qBefore = false, false
		if !f.qbAbsorb(lw) { // TILERT_GPU_QB_ABSORB (qb_absorb.go)
			o.lin(lw.QB, ws.q, ws.qa, M, c.QLoraRank, lw.QB.out)
			f.absorbQ(lw)
		}
	case f.sideQ:
		f.sideQ = false
		o.do(o.b.join()) // q_b and absorbQ ran beside the indexer
	default:
		f.absorbQ(lw)
	}
	if f.merge() && e.mla == mlaFP8 && ws.mla != 0 && mlaTCOn {
		// All slots' rows in one launch, each row on its slot's region
		// (nidx as below, the widest of the groups').
		nidx := 0
		for _, g := range f.groups {
			nidx = max(nidx, min(TK, lenBucket(g.maxLen, e.maxSeq)))
		}
		o.do(o.b.mlaDecodeRows(ws.olat, ws.qlat, ws.qpe, e.mlaOff[lw.Idx], f.bases, ws.topk, f.lens, ws.mla, M, NH, nidx, TK, e.scale))
		f.attnProjOut(lw)
		return
	}
	for _, g := range f.groups {
		// Only the first min(index_topk, length bucket) selections can be
		// valid (topK pads with -1 past each row's length), and a tile of
		// skipped entries leaves the softmax state exactly as it was: the
		// same output without scanning index_topk entries per head.
		nidx := min(TK, lenBucket(g.maxLen, e.maxSeq))
		if mode := e.prefillMLAMode(o.gemmParts()); mode != 0 && e.mla == mlaFP8 && g.n >= mlaPrefillMinRows {
			o.do(o.b.mlaPrefill(mode, fptr(ws.olat, g.first*NH*R), fptr(ws.qlat, g.first*NH*R), fptr(ws.qpe, g.first*NH*P),
				g.s.buf.Add(e.mlaOff[lw.Idx]), fptr(ws.topk, g.first*TK), fptr(f.lens, g.first), ws.mla, g.n, NH, nidx, TK, e.scale))
			continue
		}
		o.do(o.b.mlaDecode(e.mla, fptr(ws.olat, g.first*NH*R), fptr(ws.qlat, g.first*NH*R), fptr(ws.qpe, g.first*NH*P),
			g.s.buf.Add(e.mlaOff[lw.Idx]), fptr(ws.topk, g.first*TK), fptr(f.lens, g.first), ws.mla, g.n, NH, nidx, TK, e.scale))
	}
	f.attnProjOut(lw)
}

// absorbQ runs q_nope of ws.q through W_UK into ws.qlat and rotates q's
// RoPE part into ws.qpe, in one launch.
func (f *fwd) absorbQ(lw *dlayer) {
	e, o, ws := f.e, f.o, f.e.ws
	c := e.cfg
	R, P := c.KVLoraRank, c.QKRopeHeadDim
	NH, nope := c.NumHeads, c.QKNopeHeadDim
	qk := nope + P
	o.do(o.absorbQ(ws.qlat, ws.qpe, ws.q, lw.uk.w, lw.uk.s, lw.uk.fp8, f.M, NH, nope, R, NH*qk, qk, P,
		f.qRope(), f.qaScale))
}

// qRope is the rotation the query absorption applies to q's RoPE part:
// the rows' positions and the engine's tables.
func (f *fwd) qRope() kernels.QRope {
	return kernels.QRope{Pos: f.pos, Cos: f.e.ropeCos, Sin: f.e.ropeSin, Interleaved: f.e.cfg.RopeInterleave}
}

// attnProjOut projects the attention's latent output through W_UV and
// o_proj into ws.tmp.
func (f *fwd) attnProjOut(lw *dlayer) {
	e, o, ws := f.e, f.o, f.e.ws
	c := e.cfg
	H, M := c.HiddenSize, f.M
	R, NH, vd := c.KVLoraRank, c.NumHeads, c.VHeadDim
	o.do(o.absorbV(ws.ao, ws.olat, lw.uv.w, lw.uv.s, lw.uv.fp8, M, NH, vd, R, NH*vd))
	if f.oSplit > 0 {
		o.do(o.b.gemvSplitK(ws.osk, ws.ao, lw.O.w, lw.O.s, H, NH*vd, f.oSplit))
		return
	}
	o.lin(lw.O, ws.tmp, ws.ao, M, NH*vd, H)
}

// indexer writes the rows' indexer keys into the cache and each row's
// selected positions into ws.topk (ascending; 0..pos then -1 padding while
// the row sees at most index_topk positions). Layers without their own
// indexer (GLM "shared") keep the previous layer's selection.
func (f *fwd) indexer(lw *dlayer) {
	f.indexerProj(lw)
	if f.fuseIdx() {
		f.epilogue(lw, false, true)
	} else {
		f.idxEpilogue(lw)
	}
	f.idxSelect(lw)
}

// indexerProj runs the indexer's projections: wq_b of the normed q_a into
// ws.iq, wk into ws.ik, weights_proj into ws.iw.
func (f *fwd) indexerProj(lw *dlayer) {
	e, o, ws := f.e, f.o, f.e.ws
	c := e.cfg
	H, M := c.HiddenSize, f.M
	IH, ID := c.IndexNHeads, c.IndexHeadDim
	if f.qaRaw && !f.idxQB {
		// attnProj's grouped launches left q_a unnormed (they norm it in
		// their prologue).
		o.do(o.b.rmsnorm(ws.qa, ws.qa, lw.QANorm, M, c.QLoraRank, c.QLoraRank, c.QLoraRank, subEps))
		f.qaRaw = false
	}
	if !f.idxQB {
		o.lin(lw.IWQ, ws.iq, ws.qa, M, c.QLoraRank, IH*ID)
	}
	if !f.idxKW {
		o.lin(lw.IWK, ws.ik, ws.h, M, H, ID)
		o.lin(lw.IWP, ws.iw, ws.h, M, H, IH)
	}
	f.idxKW, f.idxQB = false, false
}

// idxEpilogue is the indexer's per-row work after the projections,
// unfused: the keys' LayerNorm, RoPE and cache write, then the query's
// RoPE, quantisation and head-weight scale.
func (f *fwd) idxEpilogue(lw *dlayer) {
	e, o, ws := f.e, f.o, f.e.ws
	c := e.cfg
	M := f.M
	P, IH, ID := c.QKRopeHeadDim, c.IndexNHeads, c.IndexHeadDim
	o.do(o.b.layernorm(ws.ik, ws.ik, lw.IKNormW, lw.IKNormB, M, ID, ID, ID, indexerNormEps))
	o.do(o.b.rope(ws.ik, f.pos, e.ropeCos, e.ropeSin, M, 1, ID, 0, P, c.IndexerRopeInterleave))
	for _, g := range f.groups {
		o.do(o.b.idxCacheWrite(e.idxF32, g.s.buf.Add(e.idxOff[lw.Idx]), fptr(ws.ik, g.first*ID), fptr(f.pos, g.first), g.n, ID))
	}
	if e.idxQ() {
		// Serving on the tensor cores: RoPE, vLLM's fp8 ue8m0 quantisation
		// of the query and the head-weight scale (with the softmax scale
		// folded in) in one launch.
		o.do(o.b.indexerQPrep(ws.iqh, ws.iwq, ws.iq, ws.iw, f.pos, e.ropeCos, e.ropeSin, M, IH, P, c.IndexerRopeInterleave, f.idxWScale()))
	} else {
		o.do(o.b.rope(ws.iq, f.pos, e.ropeCos, e.ropeSin, M*IH, IH, ID, 0, P, c.IndexerRopeInterleave))
		if !e.idxF32 {
			// Serving: vLLM quantises the indexer query to fp8 with
			// power-of-two scales; exact mode scores the float32 query.
			o.do(o.b.quantUE8M0(ws.iq, M*IH*ID))
		}
		o.do(o.b.scale(ws.iw, float32(math.Pow(float64(IH), -0.5)), M*IH))
	}
}

// idxSelect scores the cached keys with the prepared query and writes each
// row's selection into ws.topk.
func (f *fwd) idxSelect(lw *dlayer) {
	e, o, ws := f.e, f.o, f.e.ws
	c := e.cfg
	IH, ID, TK := c.IndexNHeads, c.IndexHeadDim, c.IndexTopK
	sm := float32(c.IndexerSoftmaxScale())
	useQ := e.idxQ()
	if f.merge() && useQ && topkRadixOn {
		// All slots' rows in one scores launch (each row on its slot's
		// pages) and one top-k; rows at <= index_topk positions get 0..pos
		// from the top-k (which also clears their histogram rows).
		maxLen := 0
		for _, g := range f.groups {
			maxLen = max(maxLen, g.maxLen)
		}
		T := lenBucket(maxLen, ws.ldScores)
		if maxLen <= TK {
			o.do(o.b.topK(ws.topk, ws.scores, f.lens, ws.tkw, f.M, T, TK, ws.ldScores, TK))
			return
		}
		hist := kernels.TopKRadixHist(ws.tkw)
		f.qBeforeScores(lw)
		o.do(o.b.indexerScoresQRows(ws.scores, ws.iqh, ws.iwq, e.idxOff[lw.Idx], f.bases, f.lens, hist, f.M, T, ws.ldScores))
		f.qAfterScores(lw)
		o.do(o.b.topKAfterHist(ws.topk, ws.scores, f.lens, ws.tkw, f.M, T, TK, ws.ldScores, TK))
		return
	}
	for _, g := range f.groups {
		// T is the length bucket, not maxLen: both kernels stop at each
		// row's lens (scores past it are -inf and never read), so the
		// launch stays the same, and a step's graph valid, as the
		// sequence grows inside the bucket.
		T := lenBucket(g.maxLen, ws.ldScores)
		scores, lens, sel := fptr(ws.scores, g.first*ws.ldScores), fptr(f.lens, g.first), fptr(ws.topk, g.first*TK)
		switch {
		case g.maxLen <= TK:
			// Every row at <= index_topk positions: the top-k kernel
			// writes 0..pos without reading the scores.
			o.do(o.b.topK(sel, scores, lens, ws.tkw, g.n, T, TK, ws.ldScores, TK))
		case useQ:
			// The scores kernel also builds the radix top-k's histogram
			// (unless that top-k is turned off).
			hist := cuda.DevPtr(0)
			if topkRadixOn {
				hist = kernels.TopKRadixHist(ws.tkw)
			}
			f.qBeforeScores(lw)
			o.do(o.b.indexerScoresQ(scores, ws.iqh.Add(int64(g.first*kernels.IndexerQRowBytes)),
				fptr(ws.iwq, g.first*kernels.IndexerQHeads), g.s.buf.Add(e.idxOff[lw.Idx]), lens, hist, g.n, T, ws.ldScores))
			f.qAfterScores(lw)
			if hist != 0 {
				o.do(o.b.topKAfterHist(sel, scores, lens, ws.tkw, g.n, T, TK, ws.ldScores, TK))
			} else {
				o.do(o.b.topK(sel, scores, lens, ws.tkw, g.n, T, TK, ws.ldScores, TK))
			}
		default:
			o.do(o.b.indexerScores(e.idxF32, scores, fptr(ws.iq, g.first*IH*ID), fptr(ws.iw, g.first*IH),
				g.s.buf.Add(e.idxOff[lw.Idx]), lens, g.n, IH, T, ws.ldScores, sm))
			o.do(o.b.topK(sel, scores, lens, ws.tkw, g.n, T, TK, ws.ldScores, TK))
		}
	}
}

// pickReq asks for the token of logits row row, chosen under p for
// position pos (the sampler's counter).
type pickReq struct {
	row    int
	p      engine.Params
	pos    int
	adjust []engine.LogitAdjust
	lp     *engine.TokenLogprobs // filled when set
	topLP  int
}

// pick chooses tokens on the device (arg-max or the device sampler) and
// copies back only the token ids.
func (e *backend) pick(o *ops, reqs []pickReq) ([]int, error) {
	lpRow, err := e.adjustForPick(o, reqs)
	if err != nil {
		return nil, err
	}
	e.choose(o, reqs)
	if len(lpRow) == 0 {
		return e.readTokens(o, len(reqs))
	}
	e.queueLogprobs(o, reqs, lpRow)
	toks, err := e.readTokens(o, len(reqs))
	if err != nil {
		return nil, err
	}
	n, K := len(lpRow), kernels.MaxTopLogprobs
	lb, ib, tb := make([]byte, 4*n), make([]byte, 4*n*K), make([]byte, 4*n*K)
	o.do(o.b.download(lb, e.lpw.lp))
	o.do(o.b.download(ib, e.lpw.topID))
	o.do(o.b.download(tb, e.lpw.topLP))
	if o.err != nil {
		return nil, o.err
	}
	fillLogprobs(reqs, lpRow, lb, ib, tb)
	return toks, nil
}

// queueLogprobs queues the logprobs of the picks that ask for them (their
// logits rows, or the raw copies adjustForPick made of them, at lpRow)
// behind the choices: the choices only read the rows.
func (e *backend) queueLogprobs(o *ops, reqs []pickReq, lpRow map[int]int) {
	V, K := e.cfg.VocabSize, kernels.MaxTopLogprobs
	raw := anyAdjust(reqs)
	for i, r := range reqs {
		if j, ok := lpRow[i]; ok {
			x := fptr(e.ws.logits, r.row*V) // nothing adjusted it: the raw row in place
			if raw {
				x = fptr(e.lpw.raw, j*V)
			}
			o.do(o.b.logprobs(x, fptr(e.ws.tok, i), fptr(e.lpw.lp, j), fptr(e.lpw.topID, j*K), fptr(e.lpw.topLP, j*K),
				1, V, V, min(r.topLP, K)))
		}
	}
}

// fillLogprobs fills each logprob pick's result from the downloaded
// logprobs (lb), top ids (ib) and top logprobs (tb).
func fillLogprobs(reqs []pickReq, lpRow map[int]int, lb, ib, tb []byte) {
	K := kernels.MaxTopLogprobs
	f32 := func(b []byte, i int) float32 { return math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:])) }
	for i, r := range reqs {
		j, ok := lpRow[i]
		if !ok {
			continue
		}
		res := engine.TokenLogprobs{Logprob: f32(lb, j)}
		for a := 0; a < min(r.topLP, K); a++ {
			res.Top = append(res.Top, engine.TopLogprob{ID: int(int32(binary.LittleEndian.Uint32(ib[4*(j*K+a):]))), Logprob: f32(tb, j*K+a)})
		}
		*r.lp = res
	}
}

// choose queues the picks' choices into ws.tok (pick i at ws.tok[i]): the
// arg-max or the device sampler over each pick's logits row.
func (e *backend) choose(o *ops, reqs []pickReq) {
	V := e.cfg.VocabSize
	for i, r := range reqs {
		lg := fptr(e.ws.logits, r.row*V)
		out := fptr(e.ws.tok, i)
		if r.p.Greedy() {
			o.do(o.b.argmax(out, lg, e.ws.amax, 1, V, V))
			continue
		}
		topP := float32(r.p.TopP)
		if topP <= 0 || topP >= 1 {
			topP = 1
		}
		sp := kernels.SamplingParams{
			Temperature: float32(r.p.Temperature), TopK: r.p.TopK, TopP: topP, MinP: float32(r.p.MinP), Seed: r.p.Seed, Step: uint64(r.pos),
		}
		if !sampleOne && r.row < len(e.rowPos) && e.rowPos[r.row]+1 == r.pos {
			// The counter from the row's position on the device: the
			// step's graph key no longer changes with it, so a sampled
			// step replays (it ran eagerly each step before).
			sp.Step, sp.StepAt = 1, fptr(e.metaCur, e.maxRows+r.row)
		}
		o.do(o.b.sample(out, lg, e.ws.samp, V, sp))
	}
}

// lpWorkspace holds what penalties and logprobs need on the device,
// allocated on first use: the adjustment entries, a copy of each picked
// row's raw logits (logprobs are of the logits before any adjustment) and
// the logprob outputs.
type lpWorkspace struct {
	adj                   cuda.DevPtr
	adjCap                int // entries
	raw, lp, topID, topLP cuda.DevPtr
}

// adjustForPick copies the raw rows whose logprobs are asked for where
// some pick adjusts its logits (anyAdjust; otherwise the logprobs read the
// rows in place), then applies every pick's adjustments in one upload and
// one launch. It returns each logprob pick's row of the logprob outputs
// (and of the raw copies).
func (e *backend) adjustForPick(o *ops, reqs []pickReq) (map[int]int, error) {
	V, K := e.cfg.VocabSize, kernels.MaxTopLogprobs
	nAdj, nLP := 0, 0
	for _, r := range reqs {
		nAdj += len(r.adjust)
		if r.lp != nil {
			nLP++
		}
	}
	if nAdj == 0 && nLP == 0 {
		return nil, nil
	}
	w := &e.lpw
	if nLP > 0 && w.raw == 0 {
		M := e.maxRows
		for _, a := range []struct {
			p *cuda.DevPtr
			n int
		}{{&w.raw, M * V}, {&w.lp, M}, {&w.topID, M * K}, {&w.topLP, M * K}} {
			p, err := e.alloc(o.b, int64(4*a.n))
			if err != nil {
				return nil, err
			}
			*a.p = p
		}
	}
	lpRow := map[int]int{}
	for i, r := range reqs {
		if r.lp != nil {
			if len(lpRow) >= e.maxRows {
				return nil, errors.Newf("logprobs for %d picks in one step (at most %d)", nLP, e.maxRows)
			}
			lpRow[i] = len(lpRow)
			if nAdj > 0 {
				o.do(o.b.copyDD(fptr(w.raw, lpRow[i]*V), fptr(e.ws.logits, r.row*V), int64(4*V)))
			}
		}
	}
	if nAdj == 0 {
		return lpRow, o.err
	}
	if nAdj > w.adjCap {
		p, err := e.alloc(o.b, int64(4*kernels.AdjustWords*max(nAdj, 4096)))
		if err != nil {
			return nil, err
		}
		w.adj, w.adjCap = p, max(nAdj, 4096) // the old buffer stays owned until Close
	}
	words := make([]byte, 0, 4*kernels.AdjustWords*nAdj)
	put := func(v uint32) { words = binary.LittleEndian.AppendUint32(words, v) }
	for _, r := range reqs {
		for _, a := range r.adjust {
			blk := uint32(0)
			if a.Block {
				blk = 1
			}
			put(uint32(r.row))
			put(uint32(a.Tok))
			put(math.Float32bits(a.Bias))
			put(math.Float32bits(a.Rep))
			put(math.Float32bits(a.Sub))
			put(blk)
		}
	}
	o.do(o.b.upload(w.adj, words))
	o.do(o.b.adjustLogits(e.ws.logits, w.adj, nAdj, V))
	return lpRow, o.err
}

// anyAdjust says whether some pick adjusts its logits (adjustForPick then
// keeps the raw rows of the logprob picks).
func anyAdjust(reqs []pickReq) bool {
	for _, r := range reqs {
		if len(r.adjust) > 0 {
			return true
		}
	}
	return false
}

func (e *backend) readTokens(o *ops, n int) ([]int, error) {
	if o.err != nil {
		return nil, o.err
	}
	b := make([]byte, 4*n)
	o.do(o.b.download(b, e.ws.tok))
	if o.err != nil {
		return nil, o.err
	}
	return e.tokensOf(b, n)
}

// tokensOf reads n token ids (int32) from b, checking each is in the vocab.
func (e *backend) tokensOf(b []byte, n int) ([]int, error) {
	out := make([]int, n)
	for i := range out {
		out[i] = int(int32(binary.LittleEndian.Uint32(b[4*i:])))
		if out[i] < 0 || out[i] >= e.cfg.VocabSize {
			return nil, errors.Newf("device picked token %d (vocab %d): the logits are not finite", out[i], e.cfg.VocabSize)
		}
	}
	return out, nil
}

// mlaWorkspaceBytes is the split MLA partials' scratch of M rows of NH
// heads: the default kernels' splits, or mla_decode_wg2's (more ranges a
// row: one block an SM) where it may run (mlaWGRule; it takes more rows
// no less often than fewer, so M rows decide).
func mlaWorkspaceBytes(M, NH int) int64 {
	n := kernels.MLAHeadsWorkspaceBytes(M, NH)
	if mlaWGRule(mlaWG, M, NH) {
		n = max(n, kernels.MLAWG2WorkspaceBytes(M, NH))
	}
	return n
}
