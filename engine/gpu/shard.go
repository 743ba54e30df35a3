package gpu

import (
	"log/slog"
	"sync"

	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/cuda"
	"github.com/tilert-go/tilert/cuda/kernels"
	"github.com/tilert-go/tilert/engine"
	"github.com/tilert-go/tilert/model"
)

// ShardOptions places a tensor-parallel engine's ranks (shard_source.go has
// the split).
type ShardOptions struct {
	// Devices is the GPU ordinal of each rank; len(Devices) is the rank
	// count. Every rank on one GPU (0,0,0,0) runs the sharded math on one
	// device, as the tests do; each distinct GPU gets its own device thread.
	Devices []int
	// Comm is the collective: CommLocal, CommOneShot, CommNCCL, or ""
	// (auto: one-shot on one GPU, NCCL across GPUs, local on the emulator).
	Comm CommKind
}

// ShardEngine is engine.Book over N tensor-parallel ranks. Not safe for
// concurrent use.
type ShardEngine struct {
	*engine.Book
	s *shardBackend
}

// shardBackend implements engine.Backend over ranks that each hold their
// shard of the weights (a backend over a shardSource) and a full copy of
// every slot's caches (the latent cache is what every head reads; rank 0's
// copy is the one exported).
type shardBackend struct {
	runners  []runner // one per device, each with its own thread
	byRunner [][]int  // the ranks on each runner
	ranks    []*backend
	plans    []shardPlan
	comm     communicator
	cfg      *model.Config
	opts     engine.Options
	layout   engine.Layout
	maxSeq   int
	closed   bool
	// graphs: the decode step's CUDA graphs when every rank is on one
	// device (all ranks' launches and the collectives in one graph).
	graphs *graphs
	// attnPart, when set (the one-shot communicator across GPUs), is each
	// rank's buffer for attention's partial sum (else ws.tmp).
	attnPart []cuda.DevPtr
}

// NewSharded opens the GPUs of so.Devices (each on its own device thread)
// and loads each rank's shard of src onto its GPU.
func NewSharded(src Source, opts engine.Options, so ShardOptions) (*ShardEngine, error) {
	if err := checkDevices(so.Devices); err != nil {
		return nil, err
	}
	if n, err := cuda.DeviceCount(); err == nil {
		for k, d := range so.Devices {
			if d >= n {
				return nil, errors.WithHintf(errors.Newf("rank %d is placed on GPU %d, which does not exist: this machine has %d GPU(s)", k, d, n),
					"list GPU ordinals 0..%d in [decode] devices / --devices (nvidia-smi -L); a GPU may repeat (--devices 0,0,0,0 runs four ranks on GPU 0)", n-1)
			}
		}
	}
	var runners []runner
	idx := map[int]int{}
	rankRunner := make([]int, len(so.Devices))
	for k, d := range so.Devices {
		i, ok := idx[d]
		if !ok {
			dev, err := cuda.Open(d)
			if err != nil {
				for _, r := range runners {
					_ = r.close()
				}
				return nil, errors.WithHint(errors.Wrapf(err, "opening GPU %d (rank %d)", d, k),
					"list GPUs that exist in [decode] devices / --devices (nvidia-smi -L)")
			}
			i = len(runners)
			idx[d] = i
			runners = append(runners, &cudaRunner{dev: dev, info: dev.Info, own: true})
		}
		rankRunner[k] = i
	}
	return buildShard(runners, rankRunner, src, opts, so.Comm)
}

// NewShardedOnDevice builds the ranks on one opened device (the caller
// keeps ownership of dev).
func NewShardedOnDevice(dev *cuda.Device, src Source, opts engine.Options, ranks int, comm CommKind) (*ShardEngine, error) {
	return buildShard([]runner{&cudaRunner{dev: dev, info: dev.Info}}, make([]int, ranks), src, opts, comm)
}

// newShardedOnStreams gives each of ranks ranks its own stream of dev and
// drives them as ranks on several GPUs are driven (a device thread's worth
// of work per phase, queued without host waits; with CommOneShot the
// communicator across GPUs: flag barriers, peer reads): that path, tested on
// one GPU. dev stays the caller's.
func newShardedOnStreams(dev *cuda.Device, src Source, opts engine.Options, ranks int, comm CommKind) (*ShardEngine, error) {
	runners := make([]runner, 0, ranks)
	rr := make([]int, ranks)
	for k := range ranks {
		var st cuda.Stream
		err := dev.Do(func(c *cuda.Ctx) error {
			var err error
			st, err = c.NewStream()
			return err
		})
		if err != nil {
			for _, r := range runners {
				err = errors.CombineErrors(err, r.close())
			}
			return nil, err
		}
		runners = append(runners, &cudaRunner{dev: dev, info: dev.Info, stream: st, ownStream: true})
		rr[k] = k
	}
	return buildShard(runners, rr, src, opts, comm)
}

// NewShardedEmulated builds the ranks over the pure-Go kernel emulation
// (one emulated device holds every rank), with the local communicator.
func NewShardedEmulated(src Source, opts engine.Options, ranks int) (*ShardEngine, error) {
	return NewShardedEmulatedOn(src, opts, make([]int, ranks))
}

// NewShardedEmulatedOn places rank k on emulated device devices[k]: one
// emulator per distinct ordinal, each driven from its own goroutine, with
// the local communicator (through host memory across devices).
func NewShardedEmulatedOn(src Source, opts engine.Options, devices []int) (*ShardEngine, error) {
	if err := checkDevices(devices); err != nil {
		return nil, err
	}
	var runners []runner
	idx := map[int]int{}
	rankRunner := make([]int, len(devices))
	for k, d := range devices {
		i, ok := idx[d]
		if !ok {
			i = len(runners)
			idx[d] = i
			runners = append(runners, &emuRunner{m: newEmu()})
		}
		rankRunner[k] = i
	}
	return buildShard(runners, rankRunner, src, opts, CommLocal)
}

// checkDevices refuses an empty list and negative ordinals.
func checkDevices(devs []int) error {
	if len(devs) == 0 {
		return errors.WithHint(errors.New("no devices"), "list one GPU ordinal per rank, e.g. --devices 0,1,2,3,4,5,6,7")
	}
	for _, d := range devs {
		if d < 0 {
			return errors.WithHint(errors.Newf("device %d", d), "GPU ordinals start at 0 (nvidia-smi -L)")
		}
	}
	return nil
}

// buildShard loads rank k onto runners[rankRunner[k]]; it owns the runners
// (closed on failure and by Close).
func buildShard(runners []runner, rankRunner []int, src Source, opts engine.Options, comm CommKind) (*ShardEngine, error) {
	N := len(rankRunner)
	full := src.Config()
	closeRunners := func(err error) (*ShardEngine, error) {
		for _, r := range runners {
			err = errors.CombineErrors(err, r.close())
		}
		return nil, err
	}
	if err := checkShardable(full, N); err != nil {
		return closeRunners(err)
	}
	if comm == "" {
		comm = CommOneShot
		if _, emu := runners[0].(*emuRunner); emu {
			comm = CommLocal
		} else if len(runners) > 1 {
			comm = CommNCCL
		}
	}
	if cs, ok := src.(convSource); ok {
		if d := cs.d.Manifest().Devices; d > 1 && d != N {
			return closeRunners(errors.WithHintf(errors.Newf("the converted weights were laid out for %d devices, this node has %d ranks", d, N),
				"convert again with tilert convert --devices %d (or --devices 1, which any node size reads), or list %d devices", N, d))
		}
	}
	s := &shardBackend{runners: runners, byRunner: make([][]int, len(runners)), cfg: full, graphs: newGraphs()}
	for k, ri := range rankRunner {
		s.byRunner[ri] = append(s.byRunner[ri], k)
	}
	fail := func(err error) (*ShardEngine, error) {
		return closeRunners(errors.CombineErrors(err, s.closeRanks()))
	}
	// Each device loads its ranks on its own thread, the devices at once.
	s.ranks, s.plans = make([]*backend, N), make([]shardPlan, N)
	errs := make([]error, len(runners))
	var wg sync.WaitGroup
	for ri := range runners {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for _, k := range s.byRunner[ri] {
				ss := newShardSource(src, N, k)
				// Ranks share their device's runner; only the shard backend closes it.
				e, err := newBackend(noClose{runners[ri]}, ss, opts)
				if err != nil {
					err = errors.Wrapf(err, "loading rank %d of %d", k, N)
					var ce *cuda.CUDAError
					if errors.As(err, &ce) && ce.Name == "CUDA_ERROR_OUT_OF_MEMORY" {
						err = errors.WithHintf(err, "the weights and caches of %d ranks do not fit this GPU's memory: spread the ranks over more GPUs (--devices), or lower --max-inflight / --max-seq-len", N)
					}
					errs[ri] = err
					return
				}
				s.sliceHeads(e, ss.p)
				s.ranks[k], s.plans[k] = e, ss.p
			}
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return fail(err)
		}
	}
	e0 := s.ranks[0]
	s.opts, s.layout, s.maxSeq = e0.opts, e0.layout, e0.maxSeq
	if len(runners) == 1 {
		// Ranks on one device share the replicated residual, its norm and
		// the final hidden states (every rank holds the same bits there,
		// and on one stream a rank's writes of them end before the next
		// rank's start), so the fused all-reduce writes them once, as a
		// node's GPU writes its own.
		for _, e := range s.ranks[1:] {
			e.ws.x, e.ws.h, e.ws.hid, e.ws.mhid = e0.ws.x, e0.ws.h, e0.ws.hid, e0.ws.mhid
		}
	}
	var err error
	if comm == CommOneShot && len(runners) > 1 {
		pc, err := newPeerComm(s)
		if err != nil {
			return fail(err)
		}
		s.comm = pc
		// Attention's partial sums get a buffer of their own: ws.tmp is
		// scratch of the MLP, which runs while peers may still read them.
		s.attnPart = make([]cuda.DevPtr, N)
		for k, e := range s.ranks {
			err := e.r.run(func(b device) error {
				var err error
				s.attnPart[k], err = e.alloc(b, int64(4*e.maxRows*full.HiddenSize))
				return err
			})
			if err != nil {
				return fail(err)
			}
		}
	} else if s.comm, err = newComm(comm, runners, N, ordinals(runners, rankRunner)); err != nil {
		return fail(err)
	}
	var bytes int64
	for _, e := range s.ranks {
		bytes += e.w.bytes
	}
	slog.Debug("sharded engine ready", "ranks", N, "devices", len(runners), "comm", comm, "slots", s.opts.Slots, "weight_bytes", bytes)
	return &ShardEngine{Book: engine.NewBookFor(s, full, s.opts, s.layout, s.maxSeq, e0.chunkLen), s: s}, nil
}

// ordinals is the GPU ordinal of each rank (0 on the emulator).
func ordinals(runners []runner, rankRunner []int) []int {
	out := make([]int, len(rankRunner))
	for k, ri := range rankRunner {
		if cr, ok := runners[ri].(*cudaRunner); ok {
			out[k] = cr.info.Ordinal
		}
	}
	return out
}

// sliceHeads makes rank e's heads (loaded as their vocabulary slice by the
// shard source, or tied to the whole embedding) the rank's rows of the
// vocabulary.
func (s *shardBackend) sliceHeads(e *backend, p shardPlan) {
	H := s.cfg.HiddenSize
	fix := func(l *dlin, table cuda.DevPtr) {
		if l.w == table && table != 0 { // tied to the embedding: offset into it
			l.w = table.Add(int64(2 * p.vocab.lo * H))
		}
		l.out = p.vocab.n()
	}
	if e.w == nil {
		return
	}
	fix(&e.w.head, e.w.embed)
	for _, lw := range e.w.layers {
		if lw.MTP {
			fix(&lw.head, e.w.embed)
		}
	}
}

// noClose shares a runner between ranks: closing a rank leaves the device
// open.
type noClose struct{ runner }

func (noClose) close() error { return nil }

func (s *shardBackend) closeRanks() error {
	var errs error
	for _, e := range s.ranks {
		if e != nil {
			errs = errors.CombineErrors(errs, e.Close())
		}
	}
	s.ranks = nil
	return errs
}

// Close implements engine.Backend: every rank's memory, the communicator,
// then the device when NewSharded opened it.
func (s *shardBackend) Close() error {
	if s.closed {
		return nil
	}
	s.closed = true
	errs := s.runners[0].run(func(b device) error {
		var errs error
		if g := grapherOf(b); g != nil && s.graphs != nil {
			errs = s.graphs.clear(g)
		}
		if s.comm != nil {
			errs = errors.CombineErrors(errs, s.comm.close(b))
		}
		return errs
	})
	if pc, ok := s.comm.(*peerComm); ok {
		errs = errors.CombineErrors(errs, pc.closeAll())
	}
	errs = errors.CombineErrors(errs, s.closeRanks())
	for _, r := range s.runners {
		errs = errors.CombineErrors(errs, r.close())
	}
	return errs
}

// Ranks is the number of tensor-parallel ranks.
func (g *ShardEngine) Ranks() int { return len(g.s.plans) }

// Config returns the model configuration (whole, not a rank's).
func (g *ShardEngine) Config() *model.Config { return g.s.cfg }

// CopyGBps is the copy rate of the first rank's GPU (Engine.CopyGBps).
func (g *ShardEngine) CopyGBps(reps int) (float64, error) { return copyGBps(g.s.runners[0], reps) }

// SharesDevice reports whether several ranks run on one GPU (then a step
// is the sum of those ranks' work, not what a node of one GPU per rank
// sees).
func (g *ShardEngine) SharesDevice() bool { return len(g.s.runners) < len(g.s.ranks) }

// Comm names the collective in use.
func (g *ShardEngine) Comm() string { return g.s.comm.name() }

// SlotBuffer implements engine.Backend: rank 0's staging buffer; Import
// copies what is written there to every rank.
func (s *shardBackend) SlotBuffer(slot int) ([]byte, error) { return s.ranks[0].SlotBuffer(slot) }

// Import implements engine.Backend: the state goes to every rank's caches
// (each rank attends its heads over the whole latent cache).
func (s *shardBackend) Import(slot int, meta engine.SlotMeta, segs []engine.Segment) error {
	if err := s.ranks[0].Import(slot, meta, segs); err != nil {
		return err
	}
	if segs == nil {
		segs = s.layout.UsedSegments(s.ranks[0].slots[slot].staging, meta.SeqLen)
	}
	for k, e := range s.ranks[1:] {
		if err := e.Import(slot, meta, segs); err != nil {
			return errors.Wrapf(err, "rank %d", k+1)
		}
	}
	return nil
}

// Export implements engine.Backend from rank 0 (ranks hold the same state).
func (s *shardBackend) Export(slot int, meta engine.SlotMeta) ([]engine.Segment, error) {
	return s.ranks[0].Export(slot, meta)
}

// Run implements engine.Backend. With every rank on one device, f runs
// inside one run on its thread; with several devices, f runs here and each
// phase of rank work goes to every device's thread in parallel, with the
// collectives between phases.
func (s *shardBackend) Run(step bool, f func(engine.Compute) error) error {
	c := &shardCompute{s: s, ops: make([]*ops, len(s.ranks))}
	if len(s.runners) > 1 {
		for k := range c.ops {
			c.ops[k] = &ops{}
		}
		err := errors.CombineErrors(f(c), c.err())
		// Phases only queued their work (no host wait per phase): the step
		// ends when every device's stream has drained.
		for _, r := range s.runners {
			err = errors.CombineErrors(err, r.run(func(device) error { return nil }))
		}
		return err
	}
	return s.runners[0].run(func(b device) error {
		// A decode step on one device replays CUDA graphs (graph.go): every
		// rank's launches and the one-shot collectives between uploads and
		// downloads, with no host round trip inside.
		var gb *graphDevice
		if g := grapherOf(b); step && s.graphs.on && g != nil {
			gb = &graphDevice{device: b, gs: s.graphs, g: g}
			b = gb
		}
		c.single = b
		for k := range c.ops {
			c.ops[k] = &ops{b: b}
		}
		if err := f(c); err != nil {
			return err
		}
		if err := c.err(); err != nil {
			return err
		}
		if gb != nil {
			return gb.flush()
		}
		return nil
	})
}

// shardCompute is engine.Compute over the ranks; it is also the
// communicators' view of the ranks (rankExec).
type shardCompute struct {
	s      *shardBackend
	single device // every rank on this device (inside its run); nil: several devices
	ops    []*ops // per rank
}

func (c *shardCompute) err() error {
	for _, o := range c.ops {
		if o.err != nil {
			return o.err
		}
	}
	return nil
}

func (c *shardCompute) do(err error) { c.ops[0].do(err) }

// each runs f for every rank on its device: in rank order on one device;
// with several, on every device's own thread at once (the ranks of a device
// in order), returning when all are done.
func (c *shardCompute) each(f func(k int, o *ops)) {
	if c.err() != nil {
		return
	}
	if c.single != nil {
		for k, o := range c.ops {
			f(k, o)
		}
		return
	}
	var wg sync.WaitGroup
	for ri, r := range c.s.runners {
		ks := c.s.byRunner[ri]
		if len(ks) == 0 {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := queue(r, func(b device) error {
				for _, k := range ks {
					c.ops[k].b = b
					f(k, c.ops[k])
				}
				return nil
			})
			c.ops[ks[0]].do(err)
		}()
	}
	wg.Wait()
}

// one runs f for rank k alone.
func (c *shardCompute) one(k int, f func(o *ops)) {
	if c.err() != nil {
		return
	}
	if c.single != nil {
		f(c.ops[k])
		return
	}
	r := c.s.runners[c.s.rankRunner(k)]
	c.ops[k].do(queue(r, func(b device) error {
		c.ops[k].b = b
		f(c.ops[k])
		return nil
	}))
}

// queue runs f on r's device thread and returns once its work is queued on
// the device's stream, without waiting for it to run (the GPU runner's run
// synchronises its stream at the end; a phase of a multi-GPU step must not:
// the next phase, the collectives and the downloads are ordered after it
// by the stream, and a download waits itself).
func queue(r runner, f func(b device) error) error {
	cr, ok := r.(*cudaRunner)
	if !ok {
		return r.run(f)
	}
	return cr.dev.Do(func(cc *cuda.Ctx) error {
		k, err := kernels.Load(cc)
		if err != nil {
			return err
		}
		b := &cudaDevice{c: cc, k: k, s: cc.Stream(), gemmWS: cr.gemmWS, gemmWSBytes: cr.gemmWSBytes}
		cr.readyModules(b)
		if cr.stream != 0 {
			b.s = cr.stream
		}
		if err := f(b); err != nil {
			// Let queued work finish before the caller looks at anything.
			return errors.CombineErrors(err, cc.SyncStream(b.s))
		}
		return nil
	})
}

func (s *shardBackend) rankRunner(k int) int {
	for ri, ks := range s.byRunner {
		for _, j := range ks {
			if j == k {
				return ri
			}
		}
	}
	return 0
}

// rankExec implementation for the communicators.
func (c *shardCompute) singleDevice() device { return c.single }
func (c *shardCompute) onRanks(f func(k int, b device) error) error {
	c.each(func(k int, o *ops) { o.do(f(k, o.b)) })
	return c.err()
}

func (c *shardCompute) Forward(rs []engine.Row, logits []bool) error {
	c.s.forward(c, rs, false, logits)
	return c.err()
}

func (c *shardCompute) KeepHidden(slot, row int) error {
	c.each(func(k int, o *ops) {
		e := c.s.ranks[k]
		o.copyRow(e.slots[slot].hidden, e.ws.hid, row, e.cfg.HiddenSize)
	})
	return c.err()
}

func (c *shardCompute) ForwardMTP(rs []engine.Row, hidden []int, logits []bool) error {
	c.each(func(k int, o *ops) { (&compute{e: c.s.ranks[k], o: o}).gatherMTPInput(rs, hidden) })
	c.s.forward(c, rs, true, logits)
	return c.err()
}

func (c *shardCompute) Pick(picks []engine.Pick) ([]int, error) {
	reqs := make([]pickReq, len(picks))
	for i, p := range picks {
		reqs[i] = pickReq{row: p.Row, p: p.Params, pos: p.Pos, adjust: p.Adjust, lp: p.LP, topLP: p.TopLP}
	}
	var toks []int
	var err error
	c.one(0, func(o *ops) { toks, err = c.s.ranks[0].pick(o, reqs) })
	if err != nil {
		return nil, err
	}
	return toks, c.err()
}

// ptrs lists field of every rank's workspace.
func (s *shardBackend) ptrs(field func(*workspace) cuda.DevPtr) []cuda.DevPtr {
	out := make([]cuda.DevPtr, len(s.ranks))
	for k, e := range s.ranks {
		out[k] = field(e.ws)
	}
	return out
}

// forward is backend.forward across the ranks: each rank runs its heads
// and its slice of every MLP; the two partial sums of a layer (attention
// output, MLP output) are all-reduced; rank 0 runs the indexer and
// broadcasts the selected positions; each rank computes its vocabulary
// slice of the logits, gathered on rank 0 by a sum over zeroed rows.
func (s *shardBackend) forward(c *shardCompute, rs []engine.Row, mtp bool, want []bool) {
	N := len(s.ranks)
	cfg := s.cfg
	H, V, TK := cfg.HiddenSize, cfg.VocabSize, cfg.IndexTopK
	eps := float32(cfg.RMSNormEps)
	M := len(rs)
	type io struct {
		layers    []*dlayer
		hid, norm cuda.DevPtr
		head      dlin
	}
	fs := make([]*fwd, N)
	in := make([]io, N)
	c.each(func(k int, o *ops) {
		e := s.ranks[k]
		rows := make([]fwdRow, len(rs))
		for i, r := range rs {
			rows[i] = fwdRow{s: e.slots[r.Slot], tok: r.Tok, pos: r.Pos}
		}
		if fs[k] = e.begin(o, rows); fs[k] != nil {
			in[k].layers, in[k].hid, in[k].norm, in[k].head = fs[k].input(mtp)
		}
	})
	if c.err() != nil {
		return
	}
	for i := range in[0].layers {
		c.each(func(k int, o *ops) {
			lw := in[k].layers[i]
			if s.plans[k].heads.n() > 0 {
				fs[k].attnIn(lw, k == 0 && lw.HasIdx)
			}
			if k == 0 && lw.HasIdx {
				fs[0].indexer(lw)
			}
		})
		if in[0].layers[i].HasIdx && N > 1 && c.err() == nil {
			c.do(s.comm.broadcast(c, s.ptrs(func(w *workspace) cuda.DevPtr { return w.topk }), 0, int64(4*M*TK)))
		}
		c.each(func(k int, o *ops) {
			ws := s.ranks[k].ws
			if s.attnPart != nil {
				// o_proj writes straight into the buffer peers read.
				tmp := ws.tmp
				ws.tmp = s.attnPart[k]
				defer func() { ws.tmp = tmp }()
			}
			if s.plans[k].heads.n() > 0 {
				fs[k].attnOut(in[k].layers[i])
			} else {
				o.do(o.b.zero(ws.tmp, int64(4*M*H)))
			}
		})
		// x += the attention sum, h = post-attention norm: one fused
		// launch where the communicator has it, else all-reduce then each
		// rank's addRMSNorm.
		fused := s.addNorm(c, s.attnPartOf, func(k int) (cuda.DevPtr, cuda.DevPtr) {
			return s.ranks[k].ws.h, in[k].layers[i].PostNorm
		}, M, H, eps)
		c.each(func(k int, o *ops) {
			lw, ws, f := in[k].layers[i], s.ranks[k].ws, fs[k]
			if !fused && s.ownsResidual(k) {
				o.do(o.b.addRMSNorm(ws.h, ws.x, ws.tmp, lw.PostNorm, M, H, H, H, H, eps))
			}
			switch {
			case lw.MoE && s.plans[k].moe.n() > 0:
				f.moe(lw)
			case !lw.MoE && s.plans[k].inter.n() > 0:
				f.ffn(lw.Gate, lw.Up, lw.Down, ws.mo)
			default:
				o.do(o.b.zero(ws.mo, int64(4*M*H)))
			}
		})
		next := func(k int) (cuda.DevPtr, cuda.DevPtr) {
			if i+1 < len(in[k].layers) {
				return s.ranks[k].ws.h, in[k].layers[i+1].InNorm
			}
			return in[k].hid, in[k].norm
		}
		if !s.addNorm(c, func(w *workspace) cuda.DevPtr { return w.mo }, next, M, H, eps) {
			c.each(func(k int, o *ops) {
				if s.ownsResidual(k) {
					y, w := next(k)
					o.do(o.b.addRMSNorm(y, s.ranks[k].ws.x, s.ranks[k].ws.mo, w, M, H, H, H, H, eps))
				}
			})
		}
	}
	c.each(func(k int, o *ops) {
		ws := s.ranks[k].ws
		v0 := s.plans[k].vocab.lo
		if N > 1 {
			o.do(o.b.zero(ws.logits, int64(4*M*V)))
		}
		if a, n, ok := headSpan(want, M); ok {
			// One launch over the wanted rows' span (headSpan): each rank's
			// vocab slice of the head is read once, not once a row.
			o.lin(in[k].head, fptr(ws.logits, a*V+v0), fptr(in[k].hid, a*H), n, H, V)
			return
		}
		for i := 0; i < M; i++ {
			if want[i] {
				o.lin(in[k].head, fptr(ws.logits, i*V+v0), fptr(in[k].hid, i*H), 1, H, V)
			}
		}
	})
	if N > 1 && c.err() == nil {
		// Only rank 0 picks tokens: it alone needs the sum.
		c.do(s.comm.reduceToRoot(c, s.ptrs(func(w *workspace) cuda.DevPtr { return w.logits }), M*V))
	}
}

// attnPartOf is the buffer attention's partial sum lands in for the rank
// of workspace w.
func (s *shardBackend) attnPartOf(w *workspace) cuda.DevPtr {
	if s.attnPart != nil {
		for k, e := range s.ranks {
			if e.ws == w {
				return s.attnPart[k]
			}
		}
	}
	return w.tmp
}

// ownsResidual reports whether rank k updates its residual itself: not a
// rank that shares rank 0's (ranks on one device), which rank 0 updates.
func (s *shardBackend) ownsResidual(k int) bool { return k == 0 || s.ranks[k].ws.x != s.ranks[0].ws.x }

// addNorm sums every rank's part buffer into its residual ws.x and writes
// the residual's RMSNorm by out(k)'s weight into out(k)'s buffer, fused in
// the communicator's one launch; false when the caller must run the
// all-reduce here and then each rank's addRMSNorm (the communicator does
// not fuse; with one rank, no all-reduce at all).
func (s *shardBackend) addNorm(c *shardCompute, part func(*workspace) cuda.DevPtr, out func(k int) (y, w cuda.DevPtr), M, H int, eps float32) bool {
	N := len(s.ranks)
	if N == 1 || c.err() != nil {
		return false
	}
	xs, hs, ws := make([]cuda.DevPtr, N), make([]cuda.DevPtr, N), make([]cuda.DevPtr, N)
	for k, e := range s.ranks {
		xs[k] = e.ws.x
		hs[k], ws[k] = out(k)
	}
	done, err := s.comm.allReduceAddNorm(c, s.ptrs(part), xs, hs, ws, M, H, eps)
	c.do(err)
	if done || c.err() != nil {
		return true
	}
	c.do(s.comm.allReduce(c, s.ptrs(part), M*H))
	return false
}

// TeacherForce is Engine.TeacherForce on the sharded engine: every
// position's logits and the MTP logits of positions 0..len(toks)-2.
func (g *ShardEngine) TeacherForce(slotID int, toks []int) (logits, mtp [][]float32, err error) {
	if err := g.CheckFree(slotID); err != nil {
		return nil, nil, err
	}
	s := g.s
	if len(toks) == 0 || len(toks) >= s.maxSeq {
		return nil, nil, errors.Wrapf(engine.ErrTooLong, "%d tokens (max_seq_len %d)", len(toks), s.maxSeq)
	}
	if err := engine.CheckTokens(s.cfg.VocabSize, toks...); err != nil {
		return nil, nil, err
	}
	e0 := s.ranks[0]
	V, L, chunk := s.cfg.VocabSize, len(toks), e0.chunkLen
	err = s.Run(false, func(cc engine.Compute) error {
		c := cc.(*shardCompute)
		for lo := 0; lo < L; lo += chunk {
			hi := min(lo+chunk, L)
			rows := make([]engine.Row, hi-lo)
			for i := range rows {
				rows[i] = engine.Row{Slot: slotID, Tok: toks[lo+i], Pos: lo + i}
			}
			s.forward(c, rows, false, nil)
			c.one(0, func(o *ops) { logits = append(logits, e0.downloadRows(o, e0.ws.logits, hi-lo, V)...) })
			if n := min(hi, L-1) - lo; e0.hasMTP() && n > 0 {
				mrows := make([]engine.Row, n)
				hidden := make([]int, n)
				for i := range mrows {
					mrows[i] = engine.Row{Slot: slotID, Tok: toks[lo+i+1], Pos: lo + i}
					hidden[i] = i
				}
				if err := c.ForwardMTP(mrows, hidden, nil); err != nil {
					return err
				}
				c.one(0, func(o *ops) { mtp = append(mtp, e0.downloadRows(o, e0.ws.logits, n, V)...) })
			}
			if err := c.err(); err != nil {
				return err
			}
		}
		return nil
	})
	return logits, mtp, err
}

// Plan describes rank k's shard: its heads, intermediate columns and
// vocabulary rows (for logs and /capabilities).
func (g *ShardEngine) Plan(k int) (heads, inter, moe, vocab [2]int) {
	p := g.s.plans[k]
	return [2]int{p.heads.lo, p.heads.hi}, [2]int{p.inter.lo, p.inter.hi}, [2]int{p.moe.lo, p.moe.hi}, [2]int{p.vocab.lo, p.vocab.hi}
}
