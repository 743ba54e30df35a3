package gpu

import (
	"encoding/binary"
	"math"
	"os"
	"time"

	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/cuda"
	"github.com/tilert-go/tilert/cuda/kernels"
)

// Decode steps replay CUDA graphs. A step is a few runs of device work
// between host synchronisation points (the meta upload, the token
// download); graphDevice defers each run's kernels, copies and memsets,
// keys the run by every argument its calls were given, and replays a
// captured graph when the same run comes again. Per-step values (token ids,
// positions, lengths) live in device buffers written by the upload before
// the run, so a steady decode repeats its runs exactly; anything that still
// varies (a sampler's step counter, a new sequence-length bucket) makes a
// new key and runs eagerly until it repeats. Replaying a graph is replaying
// the recorded calls with the recorded arguments: the emulator does exactly
// that (emuGrapher), so CI checks that every varying argument is in the key.

// captureOps records ops' device work on b as one graph.
func captureOps(g grapher, b device, ops []gop) (graphExec, error) {
	return g.capture(func() error {
		for _, op := range ops {
			if err := op.run(b); err != nil {
				return err
			}
		}
		return nil
	})
}

// grapher captures a run of backend calls into a replayable graph.
type grapher interface {
	// capture records run's device work without executing it.
	capture(run func() error) (graphExec, error)
	launch(g graphExec) error
	destroy(g graphExec) error
}

type graphExec any

// graphs is the engine's graph cache (it outlives a Step).
type graphs struct {
	on     bool
	cached map[string]graphExec
	seen   map[string]bool
	// keep, when set, collects every flushed run (ProfileStep).
	keep [][]gop
	hold bool
	// runs counts every run since the engine began (tests and notes);
	// runsAt is its value at the last HostTimes, which reports the runs
	// since then.
	runs, runsAt RunCounts
	// host is where a step's wall time goes on the host (bench decode).
	host HostTimes
	// sizes of the last flushed run: the next recording starts with room
	// for as many calls and key bytes (a step records ~300 calls; growing
	// the slices call by call was a measurable part of the host's time).
	lastOps, lastKey int
}

// HostTimes adds up, over the runs through the graph cache, the host's
// share of a decode step: recording the calls (Go work while the device may
// idle), launching them (a replay or direct launches) and waiting for the
// device at the token download.
type HostTimes struct {
	Runs                                 int
	RecordNs, LaunchNs, WaitNs, UploadNs int64
	RunCounts
}

// RunCounts counts the runs that replayed a cached graph, were captured
// into one (a capture is replayed too), or ran their calls directly (a
// key's first sighting, or a run too short to graph): a steady decode step
// replays its forwards, and a forward run eagerly step after step (its key
// changing every step) costs the device a launch gap a call.
type RunCounts struct{ Replays, Captures, Eager int }

const (
	maxGraphs     = 64   // captured graphs kept (each holds ~100 nodes)
	maxSeen       = 4096 // keys seen once, waiting for a repeat
	minGraphOps   = 4    // shorter runs launch directly
	lenBucketStep = 256  // sequence-length bucket of the indexer's launches
)

func newGraphs() *graphs {
	return &graphs{on: os.Getenv("TILERT_GPU_GRAPHS") != "0", cached: map[string]graphExec{}, seen: map[string]bool{}}
}

func (gs *graphs) clear(g grapher) error {
	var first error // a fault makes every destroy fail alike: keep one
	for k, x := range gs.cached {
		if err := g.destroy(x); err != nil && first == nil {
			first = err
		}
		delete(gs.cached, k)
	}
	gs.seen = map[string]bool{}
	return first
}

// gop is one deferred call: its name and the bytes it must move at least
// (for the profile), and the call itself.
type gop struct {
	name  string
	shape [3]int // the profile's label (GEMVs: N, K, M)
	bytes int64
	run   func(b device) error
	// afterPrev: the call reads state the previous call leaves (the top-k
	// after the scores kernel's histogram, which it zeroes for the next
	// step), so timing it alone must re-run that call first (opAlone).
	afterPrev bool
}

// opAlone returns what timing run[i] alone runs: the call, preceded by the
// call it depends on when it has one (its time is then taken net of that
// call's own, prevUs).
func opAlone(run []gop, i int, b device) (f func() error, paired bool) {
	op := run[i]
	if !op.afterPrev || i == 0 {
		return func() error { return op.run(b) }, false
	}
	prev := run[i-1]
	return func() error {
		if err := prev.run(b); err != nil {
			return err
		}
		return op.run(b)
	}, true
}

// graphDevice wraps a backend for one runner call. Methods it does not
// override (alloc, free, hostAlloc) pass straight through; upload,
// download and sync first flush the deferred run.
type graphDevice struct {
	device
	gs   *graphs
	g    grapher
	pend []gop
	key  []byte
	// mark is when the current recording began (the run's start or the
	// last flush's end).
	mark time.Time
	// timed, when set, runs each flushed call alone and times it
	// (ProfilePrefill) instead of launching or capturing the run.
	timed *opTimer
}

func (gb *graphDevice) rec(name string, bytes int64, run func(b device) error, args ...uint64) error {
	if gb.pend == nil {
		gb.pend = make([]gop, 0, gb.gs.lastOps)
		if cap(gb.key) < gb.gs.lastKey {
			gb.key = make([]byte, 0, gb.gs.lastKey)
		}
	}
	gb.key = append(gb.key, name...)
	gb.key = append(gb.key, 0)
	for _, a := range args {
		gb.key = binary.LittleEndian.AppendUint64(gb.key, a)
	}
	gb.pend = append(gb.pend, gop{name: name, bytes: bytes, run: run})
	return nil
}

// flush runs the deferred calls: a cached graph when this run was seen
// before, else directly (capturing it into a graph on its second sighting).
// shaped labels the last recorded call for the profile.
func (gb *graphDevice) shaped(a, b, c int) error {
	gb.pend[len(gb.pend)-1].shape = [3]int{a, b, c}
	return nil
}

func (gb *graphDevice) flush() error {
	if len(gb.pend) == 0 {
		return nil
	}
	t0 := time.Now()
	defer func() {
		t1 := time.Now()
		h := &gb.gs.host
		h.Runs++
		if !gb.mark.IsZero() {
			h.RecordNs += t0.Sub(gb.mark).Nanoseconds()
		}
		h.LaunchNs += t1.Sub(t0).Nanoseconds()
		gb.mark = t1
	}()
	// The key's bytes are looked up in place (m[string(b)] does not copy)
	// and copied only when stored; the buffer is reused once this returns.
	pend, key := gb.pend, gb.key
	gs := gb.gs
	gs.lastOps, gs.lastKey = max(gs.lastOps, len(pend)), max(gs.lastKey, len(key))
	gb.pend = nil
	defer func() { gb.key = key[:0] }()
	if gb.timed != nil {
		return gb.timed.run(gb.device, pend)
	}
	if gs.keep != nil || gs.hold {
		gs.keep = append(gs.keep, pend)
	}
	if _, emu := gb.g.(emuGrapher); emu {
		// The emulator runs each side chain after the main chain it
		// overlaps (side.go).
		var err error
		if pend, err = sideLast(pend); err != nil {
			return err
		}
	}
	direct := func() error {
		gs.runs.Eager++
		for _, op := range pend {
			if err := op.run(gb.device); err != nil {
				return err
			}
		}
		return nil
	}
	if len(pend) < minGraphOps {
		return direct()
	}
	if x, ok := gs.cached[string(key)]; ok {
		gs.runs.Replays++
		return gb.g.launch(x)
	}
	if !gs.seen[string(key)] {
		if len(gs.seen) >= maxSeen {
			gs.seen = map[string]bool{}
		}
		gs.seen[string(key)] = true
		return direct()
	}
	if len(gs.cached) >= maxGraphs {
		if err := gs.clear(gb.g); err != nil {
			return err
		}
	}
	x, err := captureOps(gb.g, gb.device, pend)
	if err != nil {
		return errors.Wrap(err, "capturing a decode step into a CUDA graph")
	}
	delete(gs.seen, string(key))
	gs.cached[string(key)] = x
	gs.runs.Captures++
	gs.runs.Replays++
	return gb.g.launch(x)
}

func ku(p cuda.DevPtr) uint64 { return uint64(p) }
func ki(n int) uint64         { return uint64(int64(n)) }
func kf(x float32) uint64     { return uint64(math.Float32bits(x)) }
func kb(x bool) uint64 {
	if x {
		return 1
	}
	return 0
}

func (gb *graphDevice) upload(dst cuda.DevPtr, src []byte) error {
	return gb.hostCopy(&gb.gs.host.UploadNs, func() error { return gb.device.upload(dst, src) })
}

// uploadBeside launches the deferred run, then queues the copy (timed as
// upload).
func (gb *graphDevice) uploadBeside(dst cuda.DevPtr, src []byte) error {
	return gb.hostCopy(&gb.gs.host.UploadNs, func() error { return gb.device.uploadBeside(dst, src) })
}

func (gb *graphDevice) download(dst []byte, src cuda.DevPtr) error {
	return gb.hostCopy(&gb.gs.host.WaitNs, func() error { return gb.device.download(dst, src) })
}

// hostCopy launches the deferred run, then runs copy, adding its host time
// to ns; nothing is pending after it, so the recording starts there.
func (gb *graphDevice) hostCopy(ns *int64, copy func() error) error {
	if err := gb.flush(); err != nil {
		return err
	}
	t0 := time.Now()
	err := copy()
	*ns += time.Since(t0).Nanoseconds()
	gb.mark = time.Now()
	return err
}

// downloadAsync launches the deferred run, then queues the copy: the host
// waits later, at wait (its time counts as WaitNs).
func (gb *graphDevice) downloadAsync(dst []byte, src cuda.DevPtr) (func() error, error) {
	if err := gb.flush(); err != nil {
		return nil, err
	}
	w, err := gb.device.downloadAsync(dst, src)
	gb.mark = time.Now()
	if err != nil {
		return nil, err
	}
	return func() error {
		t0 := time.Now()
		err := w()
		gb.gs.host.WaitNs += time.Since(t0).Nanoseconds()
		return err
	}, nil
}

// launchQueued launches the deferred run without waiting for it.
func (gb *graphDevice) launchQueued() error { return gb.flush() }

func (gb *graphDevice) sync() error {
	if err := gb.flush(); err != nil {
		return err
	}
	return gb.device.sync()
}

func (gb *graphDevice) copyDD(dst, src cuda.DevPtr, n int64) error {
	if n == 0 {
		return nil
	}
	return gb.rec("copyDD", 2*n, func(b device) error { return b.copyDD(dst, src, n) }, ku(dst), ku(src), uint64(n))
}

func (gb *graphDevice) zero(dst cuda.DevPtr, n int64) error {
	if n == 0 {
		return nil
	}
	return gb.rec("zero", n, func(b device) error { return b.zero(dst, n) }, ku(dst), uint64(n))
}

func (gb *graphDevice) gemvFP8(y, x, w, scale cuda.DevPtr, N, K, M, ldx, ldy int) error {
	_ = gb.rec("gemvFP8", int64(N)*int64(K), func(b device) error { return b.gemvFP8(y, x, w, scale, N, K, M, ldx, ldy) },
		ku(y), ku(x), ku(w), ku(scale), ki(N), ki(K), ki(M), ki(ldx), ki(ldy))
	return gb.shaped(N, K, M)
}

func (gb *graphDevice) gemvBF16(y, x, w cuda.DevPtr, N, K, M, ldx, ldy int) error {
	_ = gb.rec("gemvBF16", 2*int64(N)*int64(K), func(b device) error { return b.gemvBF16(y, x, w, N, K, M, ldx, ldy) },
		ku(y), ku(x), ku(w), ki(N), ki(K), ki(M), ki(ldx), ki(ldy))
	return gb.shaped(N, K, M)
}

func (gb *graphDevice) gemvF32(y, x, w cuda.DevPtr, N, K, M, ldx, ldy int) error {
	_ = gb.rec("gemvF32", 4*int64(N)*int64(K), func(b device) error { return b.gemvF32(y, x, w, N, K, M, ldx, ldy) },
		ku(y), ku(x), ku(w), ki(N), ki(K), ki(M), ki(ldx), ki(ldy))
	return gb.shaped(N, K, M)
}

func (gb *graphDevice) gemvExperts(y, x cuda.DevPtr, xstride int, wTable, sTable, ids cuda.DevPtr, slots, N, K int) error {
	_ = gb.rec("gemvExperts", int64(slots)*int64(N)*int64(K), func(b device) error {
		return b.gemvExperts(y, x, xstride, wTable, sTable, ids, slots, N, K)
	}, ku(y), ku(x), ki(xstride), ku(wTable), ku(sTable), ku(ids), ki(slots), ki(N), ki(K))
	return gb.shaped(slots, N, K)
}

func (gb *graphDevice) gemvGroup(x cuda.DevPtr, K, M, ldx int, segs []kernels.GroupSeg, norm kernels.GroupNorm) error {
	segs = append([]kernels.GroupSeg(nil), segs...) // the deferred call owns its table
	args := []uint64{ku(x), ki(K), ki(M), ki(ldx), ku(norm.W), kf(norm.Eps)}
	var bytes int64
	rows := 0
	for _, sg := range segs {
		eb := int64(1)
		if sg.BF16 {
			eb = 2
		}
		bytes += eb * int64(sg.N) * int64(K)
		rows += sg.N
		args = append(args, ku(sg.W), ku(sg.S), ku(sg.Y), ki(sg.N), ki(sg.LdY), kb(sg.BF16), ku(sg.OutW), ku(sg.SumSq))
	}
	name := "gemvGroup"
	if len(segs) > 0 && segs[0].OutW != 0 {
		name = "gemvGroupQW" // TILERT_GPU_QA_NORM=late's (the profile's own row)
	}
	_ = gb.rec(name, bytes, func(b device) error { return b.gemvGroup(x, K, M, ldx, segs, norm) }, args...)
	return gb.shaped(rows, K, M)
}

func (gb *graphDevice) rmsnorm(y, x, w cuda.DevPtr, rows, D, ldx, ldy int, eps float32) error {
	return gb.rec("rmsnorm", int64(8*rows*D), func(b device) error { return b.rmsnorm(y, x, w, rows, D, ldx, ldy, eps) },
		ku(y), ku(x), ku(w), ki(rows), ki(D), ki(ldx), ki(ldy), kf(eps))
}

func (gb *graphDevice) layernorm(y, x, w, bb cuda.DevPtr, rows, D, ldx, ldy int, eps float32) error {
	return gb.rec("layernorm", int64(8*rows*D), func(b device) error { return b.layernorm(y, x, w, bb, rows, D, ldx, ldy, eps) },
		ku(y), ku(x), ku(w), ku(bb), ki(rows), ki(D), ki(ldx), ki(ldy), kf(eps))
}

func (gb *graphDevice) rope(x, pos, cos, sin cuda.DevPtr, rows, rowsPerTok, ld, off, rot int, interleaved bool) error {
	return gb.rec("rope", int64(8*rows*rot), func(b device) error {
		return b.rope(x, pos, cos, sin, rows, rowsPerTok, ld, off, rot, interleaved)
	}, ku(x), ku(pos), ku(cos), ku(sin), ki(rows), ki(rowsPerTok), ki(ld), ki(off), ki(rot), kb(interleaved))
}

func (gb *graphDevice) add(y, a, bb cuda.DevPtr, n int) error {
	return gb.rec("add", int64(12*n), func(b device) error { return b.add(y, a, bb, n) }, ku(y), ku(a), ku(bb), ki(n))
}

func (gb *graphDevice) addRMSNorm(y, x, bb, w cuda.DevPtr, rows, D, ldx, ldb, ldy int, eps float32) error {
	return gb.rec("addRMSNorm", int64(16*rows*D), func(b device) error { return b.addRMSNorm(y, x, bb, w, rows, D, ldx, ldb, ldy, eps) },
		ku(y), ku(x), ku(bb), ku(w), ki(rows), ki(D), ki(ldx), ki(ldb), ki(ldy), kf(eps))
}

func (gb *graphDevice) siluMul(out, gate, up cuda.DevPtr, rows, I, ldg, ldu, ldo int) error {
	return gb.rec("siluMul", int64(12*rows*I), func(b device) error { return b.siluMul(out, gate, up, rows, I, ldg, ldu, ldo) },
		ku(out), ku(gate), ku(up), ki(rows), ki(I), ki(ldg), ki(ldu), ki(ldo))
}

func (gb *graphDevice) embed(out, table, ids cuda.DevPtr, T, D, V int) error {
	return gb.rec("embed", int64(6*T*D), func(b device) error { return b.embed(out, table, ids, T, D, V) }, ku(out), ku(table), ku(ids), ki(T), ki(D), ki(V))
}

func (gb *graphDevice) moeCombine(out, y, w, resid cuda.DevPtr, k, N int) error {
	return gb.rec("moeCombine", int64(4*(k+1)*N), func(b device) error { return b.moeCombine(out, y, w, resid, k, N) },
		ku(out), ku(y), ku(w), ku(resid), ki(k), ki(N))
}

func (gb *graphDevice) gateUp(y, x, wg, sg, wu, su cuda.DevPtr, N, K, M, ldx, ldy int) error {
	_ = gb.rec("gateUp", 2*int64(N)*int64(K), func(b device) error { return b.gateUp(y, x, wg, sg, wu, su, N, K, M, ldx, ldy) },
		ku(y), ku(x), ku(wg), ku(sg), ku(wu), ku(su), ki(N), ki(K), ki(M), ki(ldx), ki(ldy))
	return gb.shaped(N, K, M)
}

func (gb *graphDevice) experts(y, x cuda.DevPtr, ldx, xdiv, xsh int, t, ts [2]cuda.DevPtr, ids cuda.DevPtr, slots int, w, ws [2]cuda.DevPtr, dense, N, K int) error {
	name, per := "experts", int64(1)
	if t[1] != 0 || w[1] != 0 {
		name, per = "expertsGateUp", 2
	}
	_ = gb.rec(name, per*int64(slots+dense)*int64(N)*int64(K), func(b device) error {
		return b.experts(y, x, ldx, xdiv, xsh, t, ts, ids, slots, w, ws, dense, N, K)
	}, ku(y), ku(x), ki(ldx), ki(xdiv), ki(xsh), ku(t[0]), ku(t[1]), ku(ts[0]), ku(ts[1]), ku(ids), ki(slots),
		ku(w[0]), ku(w[1]), ku(ws[0]), ku(ws[1]), ki(dense), ki(N), ki(K))
	return gb.shaped(slots+dense, N, K)
}

func (gb *graphDevice) expertsShaped(y, x cuda.DevPtr, ldx, xdiv, xsh int, t, ts [2]cuda.DevPtr, ids cuda.DevPtr, slots int, w, ws [2]cuda.DevPtr, dense, N, K, shapeSlots int) error {
	name, per := "experts", int64(1)
	if t[1] != 0 || w[1] != 0 {
		name, per = "expertsGateUp", 2
	}
	_ = gb.rec(name, per*int64(slots+dense)*int64(N)*int64(K), func(b device) error {
		return b.expertsShaped(y, x, ldx, xdiv, xsh, t, ts, ids, slots, w, ws, dense, N, K, shapeSlots)
	}, ku(y), ku(x), ki(ldx), ki(xdiv), ki(xsh), ku(t[0]), ku(t[1]), ku(ts[0]), ku(ts[1]), ku(ids), ki(slots),
		ku(w[0]), ku(w[1]), ku(ws[0]), ku(ws[1]), ki(dense), ki(N), ki(K), ki(shapeSlots))
	return gb.shaped(slots+dense, N, K)
}

func (gb *graphDevice) moeCombineSlots(out, y, w, resid cuda.DevPtr, M, k, N int) error {
	return gb.rec("moeCombine", int64(4*M*(k+2)*N), func(b device) error { return b.moeCombineSlots(out, y, w, resid, M, k, N) },
		ku(out), ku(y), ku(w), ku(resid), ki(M), ki(k), ki(N))
}

func (gb *graphDevice) moeCombineNorm(ny, x, out, y, w, resid, nw cuda.DevPtr, M, k, N int, eps float32) error {
	return gb.rec("moeCombineNorm", int64(4*M*(k+5)*N), func(b device) error {
		return b.moeCombineNorm(ny, x, out, y, w, resid, nw, M, k, N, eps)
	}, ku(ny), ku(x), ku(out), ku(y), ku(w), ku(resid), ku(nw), ki(M), ki(k), ki(N), kf(eps))
}

func (gb *graphDevice) moeRoute(idx, wts, logits, bias cuda.DevPtr, T, E, K, ngroup, topkGroup int, norm bool, scale float32) error {
	return gb.rec("moeRoute", int64(8*T*E), func(b device) error {
		return b.moeRoute(idx, wts, logits, bias, T, E, K, ngroup, topkGroup, norm, scale)
	}, ku(idx), ku(wts), ku(logits), ku(bias), ki(T), ki(E), ki(K), ki(ngroup), ki(topkGroup), kb(norm), kf(scale))
}

func (gb *graphDevice) indexerScores(f32 bool, out, q, w, cache, lens cuda.DevPtr, nq, H, T, ldOut int, qkScale float32) error {
	return gb.rec("indexerScores", int64(T)*(kernels.IndexerPageBytes/64), func(b device) error {
		return b.indexerScores(f32, out, q, w, cache, lens, nq, H, T, ldOut, qkScale)
	}, kb(f32), ku(out), ku(q), ku(w), ku(cache), ku(lens), ki(nq), ki(H), ki(T), ki(ldOut), kf(qkScale))
}

func (gb *graphDevice) indexerQPrep(qh, wq, q, w, pos, cos, sin cuda.DevPtr, M, H, rot int, interleaved bool, wscale float32) error {
	return gb.rec("indexerQPrep", int64(4*M*H*(kernels.IndexerHeadDim+1)+M*kernels.IndexerQRowBytes), func(b device) error {
		return b.indexerQPrep(qh, wq, q, w, pos, cos, sin, M, H, rot, interleaved, wscale)
	}, ku(qh), ku(wq), ku(q), ku(w), ku(pos), ku(cos), ku(sin), ki(M), ki(H), ki(rot), kb(interleaved), kf(wscale))
}

func (gb *graphDevice) indexerScoresQ(out, qh, wq, cache, lens, hist cuda.DevPtr, nq, T, ldOut int) error {
	return gb.rec("indexerScoresQ", int64(T)*(kernels.IndexerPageBytes/64), func(b device) error {
		return b.indexerScoresQ(out, qh, wq, cache, lens, hist, nq, T, ldOut)
	}, ku(out), ku(qh), ku(wq), ku(cache), ku(lens), ku(hist), ki(nq), ki(T), ki(ldOut))
}

func (gb *graphDevice) topKAfterHist(out, scores, lens, scratch cuda.DevPtr, rows, T, K, ld, ldOut int) error {
	err := gb.rec("topK", int64(4*rows*K), func(b device) error { return b.topKAfterHist(out, scores, lens, scratch, rows, T, K, ld, ldOut) },
		ku(out), ku(scores), ku(lens), ku(scratch), ki(rows), ki(T), ki(K), ki(ld), ki(ldOut), 1)
	gb.pend[len(gb.pend)-1].afterPrev = true
	return err
}

func (gb *graphDevice) topK(out, scores, lens, scratch cuda.DevPtr, rows, T, K, ld, ldOut int) error {
	return gb.rec("topK", int64(4*rows*K), func(b device) error { return b.topK(out, scores, lens, scratch, rows, T, K, ld, ldOut) },
		ku(out), ku(scores), ku(lens), ku(scratch), ki(rows), ki(T), ki(K), ki(ld), ki(ldOut))
}

func (gb *graphDevice) mlaDecode(kind mlaKind, out, qn, qp, cache, indices, lens, ws cuda.DevPtr, nq, H, nidx, ldIdx int, scale float32) error {
	_ = gb.rec("mlaDecode", int64(nq)*int64(H)*(kernels.MLALatentDim+kernels.MLARopeDim)*8, func(b device) error {
		return b.mlaDecode(kind, out, qn, qp, cache, indices, lens, ws, nq, H, nidx, ldIdx, scale)
	}, uint64(kind), ku(out), ku(qn), ku(qp), ku(cache), ku(indices), ku(lens), ku(ws), ki(nq), ki(H), ki(nidx), ki(ldIdx), kf(scale))
	return gb.shaped(nq, H, nidx)
}

func (gb *graphDevice) mlaPrefill(mode int, out, qn, qp, cache, indices, lens, ws cuda.DevPtr, nq, H, nidx, ldIdx int, scale float32) error {
	_ = gb.rec("mlaPrefill", int64(nq)*int64(H)*(kernels.MLALatentDim+kernels.MLARopeDim)*8, func(b device) error {
		return b.mlaPrefill(mode, out, qn, qp, cache, indices, lens, ws, nq, H, nidx, ldIdx, scale)
	}, 2<<32|uint64(mode), ku(out), ku(qn), ku(qp), ku(cache), ku(indices), ku(lens), ku(ws), ki(nq), ki(H), ki(nidx), ki(ldIdx), kf(scale))
	return gb.shaped(nq, H, nidx)
}

func (gb *graphDevice) mlaDecodeRows(out, qn, qp cuda.DevPtr, cacheOff int64, rowBase, indices, lens, ws cuda.DevPtr, nq, H, nidx, ldIdx int, scale float32) error {
	_ = gb.rec("mlaDecode", int64(nq)*int64(H)*(kernels.MLALatentDim+kernels.MLARopeDim)*8, func(b device) error {
		return b.mlaDecodeRows(out, qn, qp, cacheOff, rowBase, indices, lens, ws, nq, H, nidx, ldIdx, scale)
	}, 1<<32, ku(out), ku(qn), ku(qp), uint64(cacheOff), ku(rowBase), ku(indices), ku(lens), ku(ws), ki(nq), ki(H), ki(nidx), ki(ldIdx), kf(scale))
	return gb.shaped(nq, H, nidx)
}

func (gb *graphDevice) indexerScoresQRows(out, qh, wq cuda.DevPtr, cacheOff int64, rowBase, lens, hist cuda.DevPtr, nq, T, ldOut int) error {
	return gb.rec("indexerScoresQ", int64(nq)*int64(T)*(kernels.IndexerPageBytes/64), func(b device) error {
		return b.indexerScoresQRows(out, qh, wq, cacheOff, rowBase, lens, hist, nq, T, ldOut)
	}, 1<<32, ku(out), ku(qh), ku(wq), uint64(cacheOff), ku(rowBase), ku(lens), ku(hist), ki(nq), ki(T), ki(ldOut))
}

func (gb *graphDevice) argmax(out, x, scratch cuda.DevPtr, rows, n, ld int) error {
	return gb.rec("argmax", int64(4*rows*n), func(b device) error { return b.argmax(out, x, scratch, rows, n, ld) },
		ku(out), ku(x), ku(scratch), ki(rows), ki(n), ki(ld))
}

func (gb *graphDevice) sample(out, logits, scratch cuda.DevPtr, n int, p kernels.SamplingParams) error {
	return gb.rec("sample", int64(4*n), func(b device) error { return b.sample(out, logits, scratch, n, p) },
		ku(out), ku(logits), ku(scratch), ku(p.StepAt), ki(n), kf(p.Temperature), ki(p.TopK), kf(p.TopP), kf(p.MinP), p.Seed, p.Step)
}

func (gb *graphDevice) adjustLogits(x, entries cuda.DevPtr, n, ld int) error {
	return gb.rec("adjustLogits", int64(4*kernels.AdjustWords*n), func(b device) error { return b.adjustLogits(x, entries, n, ld) },
		ku(x), ku(entries), ki(n), ki(ld))
}

func (gb *graphDevice) logprobs(x, tok, lp, topID, topLP cuda.DevPtr, rows, n, ld, k int) error {
	return gb.rec("logprobs", int64(4*rows*n*(k+2)), func(b device) error { return b.logprobs(x, tok, lp, topID, topLP, rows, n, ld, k) },
		ku(x), ku(tok), ku(lp), ku(topID), ku(topLP), ki(rows), ki(n), ki(ld), ki(k))
}

func (gb *graphDevice) mlaCacheWrite(kind mlaKind, cache, src, pos cuda.DevPtr, n, ld int) error {
	return gb.rec("mlaCacheWrite", int64(4*n*ld), func(b device) error { return b.mlaCacheWrite(kind, cache, src, pos, n, ld) },
		uint64(kind), ku(cache), ku(src), ku(pos), ki(n), ki(ld))
}

func (gb *graphDevice) idxCacheWrite(f32 bool, cache, src, pos cuda.DevPtr, n, ld int) error {
	return gb.rec("idxCacheWrite", int64(4*n*ld), func(b device) error { return b.idxCacheWrite(f32, cache, src, pos, n, ld) },
		kb(f32), ku(cache), ku(src), ku(pos), ki(n), ki(ld))
}

func (gb *graphDevice) quantUE8M0(x cuda.DevPtr, n int) error {
	return gb.rec("quantUE8M0", int64(8*n), func(b device) error { return b.quantUE8M0(x, n) }, ku(x), ki(n))
}

func (gb *graphDevice) copy2D(dst, src cuda.DevPtr, rows, cols, ldd, lds int) error {
	return gb.rec("copy2D", int64(8*rows*cols), func(b device) error { return b.copy2D(dst, src, rows, cols, ldd, lds) },
		ku(dst), ku(src), ki(rows), ki(cols), ki(ldd), ki(lds))
}

func (gb *graphDevice) scale(x cuda.DevPtr, a float32, n int) error {
	return gb.rec("scale", int64(8*n), func(b device) error { return b.scale(x, a, n) }, ku(x), kf(a), ki(n))
}

func (gb *graphDevice) absorbQ(out, qpe, q, w, s cuda.DevPtr, fp8 bool, M, H, nope, R, ldq, hs, P int, rope kernels.QRope, qs kernels.QScale) error {
	wb := int64(4)
	if fp8 {
		wb = 1
	}
	return gb.rec("absorbQ", wb*int64(H*nope*R), func(b device) error { return b.absorbQ(out, qpe, q, w, s, fp8, M, H, nope, R, ldq, hs, P, rope, qs) },
		ku(out), ku(qpe), ku(q), ku(w), ku(s), kb(fp8), ki(M), ki(H), ki(nope), ki(R), ki(ldq), ki(hs), ki(P),
		ku(rope.Pos), ku(rope.Cos), ku(rope.Sin), kb(rope.Interleaved), ku(qs.SumSq), ki(qs.N), ki(qs.K), kf(qs.Eps))
}

func (gb *graphDevice) absorbV(out, x, w, s cuda.DevPtr, fp8 bool, M, H, vd, R, ldo int) error {
	wb := int64(4)
	if fp8 {
		wb = 1
	}
	return gb.rec("absorbV", wb*int64(H*vd*R), func(b device) error { return b.absorbV(out, x, w, s, fp8, M, H, vd, R, ldo) },
		ku(out), ku(x), ku(w), ku(s), kb(fp8), ki(M), ki(H), ki(vd), ki(R), ki(ldo))
}

func (gb *graphDevice) attnEpilogue(a kernels.AttnEpilogue) error {
	return gb.rec("attnEpilogue", int64(a.Rows)*(4*2*(kernels.MLALatentDim+kernels.MLARopeDim+kernels.IndexerHeadDim)+
		int64(a.IH)*4*(kernels.IndexerHeadDim+1)+kernels.MLATokenBytes+kernels.IndexerQRowBytes), func(b device) error {
		return b.attnEpilogue(a)
	}, ku(a.KVA), ki(a.LdKV), ku(a.KVNorm), kf(a.KVEps), ku(a.MLACache), kb(a.KVInterleaved),
		ku(a.IK), ki(a.LdIK), ku(a.IKNormW), ku(a.IKNormB), kf(a.IKEps), ku(a.IdxCache), kb(a.IdxInterleaved),
		ku(a.IQ), ku(a.IW), ku(a.QH), ku(a.WQ), ki(a.IH), kf(a.WScale), ku(a.Pos), ku(a.Cos), ku(a.Sin), ki(a.Rot), ki(a.Rows),
		ku(a.Bases), uint64(a.MLAOff), uint64(a.IdxOff), kb(a.MLARows), kb(a.IdxRows),
		ku(a.QS.SumSq), ki(a.QS.N), ki(a.QS.K), kf(a.QS.Eps))
}

// cudaGrapher captures on the backend's stream (thread-local capture: only
// the device thread's own calls are recorded).
type cudaGrapher struct{ b *cudaDevice }

func (g cudaGrapher) capture(run func() error) (graphExec, error) {
	if err := g.b.c.BeginCapture(g.b.s); err != nil {
		return nil, err
	}
	rerr := run()
	x, err := g.b.c.EndCaptureWith(g.b.s, g.b.prio != prioOff)
	if rerr != nil || err != nil {
		if x != nil {
			_ = g.b.c.DestroyGraph(x)
		}
		return nil, errors.CombineErrors(rerr, err)
	}
	return x, nil
}

func (g cudaGrapher) launch(x graphExec) error { return g.b.c.LaunchGraph(x.(*cuda.Graph), g.b.s) }
func (g cudaGrapher) destroy(x graphExec) error {
	return g.b.c.DestroyGraph(x.(*cuda.Graph))
}

// emuGrapher "captures" by keeping the calls with their arguments and
// replays them: exactly what a stale CUDA graph would do.
type emuGrapher struct{}

func (emuGrapher) capture(run func() error) (graphExec, error) { return run, nil }
func (emuGrapher) launch(x graphExec) error                    { return x.(func() error)() }
func (emuGrapher) destroy(graphExec) error                     { return nil }

// grapherOf returns the grapher for the runner's backend (nil: none, run
// eagerly).
func grapherOf(b device) grapher {
	switch x := b.(type) {
	case *cudaDevice:
		return cudaGrapher{x}
	case *emuDevice:
		return emuGrapher{}
	}
	return nil
}

// runGraphed runs f like e.r.runAhead, through graphDevice when graphs are
// on.
func (e *backend) runGraphed(f func(b device) (bool, error)) error {
	return e.r.runAhead(func(b device) (bool, error) {
		g := grapherOf(b)
		if !e.graphs.on || g == nil {
			return f(b)
		}
		gb := &graphDevice{device: b, gs: e.graphs, g: g, mark: time.Now()}
		ahead, err := f(gb)
		if err != nil {
			return false, err
		}
		return ahead, gb.flush()
	})
}

// lenBucket rounds a sequence length up to the bucket the indexer's
// launches use (their kernels bound the work by lens on the device), so a
// graph stays valid while the sequence grows inside the bucket.
func lenBucket(n, limit int) int {
	return min(limit, (n+lenBucketStep-1)/lenBucketStep*lenBucketStep)
}
