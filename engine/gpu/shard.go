package gpu

import (
	"log/slog"

	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/cuda"
	"github.com/tilert-go/tilert/engine"
	"github.com/tilert-go/tilert/model"
)

// ShardOptions places a tensor-parallel engine's ranks (shard_source.go has
// the split).
type ShardOptions struct {
	// Devices is the GPU ordinal of each rank; len(Devices) is the rank
	// count. Every rank on one GPU (0,0,0,0) runs the sharded math on one
	// device, as the tests do.
	Devices []int
	// Comm is the collective: CommLocal, CommOneShot or CommNCCL.
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
	r      runner
	ranks  []*backend
	plans  []shardPlan
	comm   communicator
	cfg    *model.Config
	opts   engine.Options
	layout engine.Layout
	maxSeq int
	closed bool
}

// NewSharded opens the GPUs of so.Devices and loads each rank's shard of src
// onto its device. Every rank must be on the same GPU for now (the
// per-device runners of a multi-GPU node are the next step).
func NewSharded(src Source, opts engine.Options, so ShardOptions) (*ShardEngine, error) {
	if err := checkDevices(so.Devices); err != nil {
		return nil, err
	}
	dev, err := cuda.Open(so.Devices[0])
	if err != nil {
		return nil, errors.WithHint(errors.Wrapf(err, "opening GPU %d (rank 0)", so.Devices[0]),
			"list GPUs that exist in [decode] devices / --devices (nvidia-smi -L)")
	}
	e, err := buildShard(&cudaRunner{dev: dev, info: dev.Info, own: true}, src, opts, so)
	if err != nil {
		_ = dev.Close()
		return nil, err
	}
	return e, nil
}

// NewShardedOnDevice builds the ranks on one opened device (the caller
// keeps ownership of dev).
func NewShardedOnDevice(dev *cuda.Device, src Source, opts engine.Options, ranks int, comm CommKind) (*ShardEngine, error) {
	return buildShard(&cudaRunner{dev: dev, info: dev.Info}, src, opts, ShardOptions{Devices: make([]int, ranks), Comm: comm})
}

// NewShardedEmulated builds the ranks over the pure-Go kernel emulation
// (one emulated device holds every rank), with the local communicator.
func NewShardedEmulated(src Source, opts engine.Options, ranks int) (*ShardEngine, error) {
	return buildShard(&emuRunner{m: newEmu()}, src, opts, ShardOptions{Devices: make([]int, ranks), Comm: CommLocal})
}

// checkDevices refuses an empty list, negative ordinals and ranks spread
// over several GPUs (not yet driven).
func checkDevices(devs []int) error {
	if len(devs) == 0 {
		return errors.WithHint(errors.New("no devices"), "list one GPU ordinal per rank, e.g. --devices 0,1,2,3,4,5,6,7")
	}
	for _, d := range devs {
		if d < 0 {
			return errors.WithHint(errors.Newf("device %d", d), "GPU ordinals start at 0 (nvidia-smi -L)")
		}
		if d != devs[0] {
			return errors.WithHint(errors.Newf("devices %v: ranks on different GPUs are not driven yet (each GPU needs its own runner thread and peer-mapped buffers)", devs),
				"run the ranks on one GPU (e.g. --devices 0,0) or one rank per node (--devices 0)")
		}
	}
	return nil
}

func buildShard(r runner, src Source, opts engine.Options, so ShardOptions) (*ShardEngine, error) {
	N := len(so.Devices)
	full := src.Config()
	if err := checkShardable(full, N); err != nil {
		return nil, err
	}
	if so.Comm == "" {
		so.Comm = CommLocal
	}
	if cs, ok := src.(convSource); ok {
		if d := cs.d.Manifest().Devices; d > 1 && d != N {
			return nil, errors.WithHintf(errors.Newf("the converted weights were laid out for %d devices, this node has %d ranks", d, N),
				"convert again with tilert convert --devices %d (or --devices 1, which any node size reads), or list %d devices", N, d)
		}
	}
	s := &shardBackend{r: r, cfg: full}
	fail := func(err error) (*ShardEngine, error) {
		s.closeRanks()
		return nil, errors.CombineErrors(err, r.close())
	}
	for k := 0; k < N; k++ {
		ss := newShardSource(src, N, k)
		// The ranks share r; only the shard backend closes it.
		e, err := newBackend(noClose{r}, ss, opts)
		if err != nil {
			err = errors.Wrapf(err, "loading rank %d of %d", k, N)
			var ce *cuda.CUDAError
			if errors.As(err, &ce) && ce.Name == "CUDA_ERROR_OUT_OF_MEMORY" {
				err = errors.WithHintf(err, "the weights and caches of %d ranks do not fit this GPU's memory: spread the ranks over more GPUs (--devices), or lower --max-inflight / --max-seq-len", N)
			}
			return fail(err)
		}
		s.ranks = append(s.ranks, e)
		s.plans = append(s.plans, ss.p)
		s.sliceHeads(e, ss.p)
	}
	e0 := s.ranks[0]
	s.opts, s.layout, s.maxSeq = e0.opts, e0.layout, e0.maxSeq
	var err error
	if s.comm, err = newComm(so.Comm, r, N); err != nil {
		return fail(err)
	}
	var bytes int64
	for _, e := range s.ranks {
		bytes += e.w.bytes
	}
	slog.Debug("sharded engine ready", "ranks", N, "comm", so.Comm, "slots", s.opts.Slots, "weight_bytes", bytes)
	return &ShardEngine{Book: engine.NewBookFor(s, full, s.opts, s.layout, s.maxSeq, e0.chunkLen), s: s}, nil
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
		errs = errors.CombineErrors(errs, e.Close())
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
	var errs error
	if s.comm != nil {
		errs = s.r.run(func(b device) error { return s.comm.close(b) })
	}
	errs = errors.CombineErrors(errs, s.closeRanks())
	return errors.CombineErrors(errs, s.r.close())
}

// Ranks is the number of tensor-parallel ranks.
func (g *ShardEngine) Ranks() int { return len(g.s.plans) }

// Config returns the model configuration (whole, not a rank's).
func (g *ShardEngine) Config() *model.Config { return g.s.cfg }

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

// Run implements engine.Backend: every rank's work runs in one device run
// (all ranks are on one device), with the collectives between.
func (s *shardBackend) Run(step bool, f func(engine.Compute) error) error {
	return s.r.run(func(b device) error {
		c := &shardCompute{s: s, o: &ops{b: b}}
		if err := f(c); err != nil {
			return err
		}
		return c.o.err
	})
}

type shardCompute struct {
	s *shardBackend
	o *ops
}

func (c *shardCompute) devs() []device {
	d := make([]device, len(c.s.ranks))
	for i := range d {
		d[i] = c.o.b
	}
	return d
}

func (c *shardCompute) Forward(rs []engine.Row, logits []bool) error {
	c.s.forward(c, rs, false, logits)
	return c.o.err
}

func (c *shardCompute) KeepHidden(slot, row int) error {
	for _, e := range c.s.ranks {
		c.o.copyRow(e.slots[slot].hidden, e.ws.hid, row, e.cfg.HiddenSize)
	}
	return c.o.err
}

func (c *shardCompute) ForwardMTP(rs []engine.Row, hidden []int, logits []bool) error {
	for _, e := range c.s.ranks {
		(&compute{e: e, o: c.o}).gatherMTPInput(rs, hidden)
	}
	c.s.forward(c, rs, true, logits)
	return c.o.err
}

func (c *shardCompute) Pick(picks []engine.Pick) ([]int, error) {
	reqs := make([]pickReq, len(picks))
	for i, p := range picks {
		reqs[i] = pickReq{row: p.Row, p: p.Params, pos: p.Pos, adjust: p.Adjust, lp: p.LP, topLP: p.TopLP}
	}
	return c.s.ranks[0].pick(c.o, reqs)
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
	o := c.o
	N := len(s.ranks)
	devs := c.devs()
	cfg := s.cfg
	H, V, TK := cfg.HiddenSize, cfg.VocabSize, cfg.IndexTopK
	eps := float32(cfg.RMSNormEps)
	fs := make([]*fwd, N)
	for k, e := range s.ranks {
		rows := make([]fwdRow, len(rs))
		for i, r := range rs {
			rows[i] = fwdRow{s: e.slots[r.Slot], tok: r.Tok, pos: r.Pos}
		}
		if fs[k] = e.begin(o, rows); fs[k] == nil {
			return
		}
	}
	M := len(rs)
	type io struct {
		layers    []*dlayer
		hid, norm cuda.DevPtr
		head      dlin
	}
	in := make([]io, N)
	for k, f := range fs {
		in[k].layers, in[k].hid, in[k].norm, in[k].head = f.input(mtp)
	}
	allReduce := func(field func(*workspace) cuda.DevPtr, n int) {
		if N > 1 && o.err == nil {
			o.do(s.comm.allReduce(devs, s.ptrs(field), n))
		}
	}
	for i := range in[0].layers {
		for k, f := range fs {
			if s.plans[k].heads.n() > 0 {
				f.attnIn(in[k].layers[i])
			}
		}
		if in[0].layers[i].HasIdx {
			fs[0].indexer(in[0].layers[i])
			if N > 1 && o.err == nil {
				o.do(s.comm.broadcast(devs, s.ptrs(func(w *workspace) cuda.DevPtr { return w.topk }), 0, int64(4*M*TK)))
			}
		}
		for k, f := range fs {
			if s.plans[k].heads.n() > 0 {
				f.attnOut(in[k].layers[i])
			} else {
				o.do(o.b.zero(s.ranks[k].ws.tmp, int64(4*M*H)))
			}
		}
		allReduce(func(w *workspace) cuda.DevPtr { return w.tmp }, M*H)
		for k, f := range fs {
			lw, ws := in[k].layers[i], s.ranks[k].ws
			o.do(o.b.addRMSNorm(ws.h, ws.x, ws.tmp, lw.PostNorm, M, H, H, H, H, eps))
			switch {
			case lw.MoE && s.plans[k].moe.n() > 0:
				f.moe(lw)
			case !lw.MoE && s.plans[k].inter.n() > 0:
				f.ffn(lw.Gate, lw.Up, lw.Down, ws.mo)
			default:
				o.do(o.b.zero(ws.mo, int64(4*M*H)))
			}
		}
		allReduce(func(w *workspace) cuda.DevPtr { return w.mo }, M*H)
		for k := range fs {
			ws := s.ranks[k].ws
			y, w := in[k].hid, in[k].norm
			if i+1 < len(in[k].layers) {
				y, w = ws.h, in[k].layers[i+1].InNorm
			}
			o.do(o.b.addRMSNorm(y, ws.x, ws.mo, w, M, H, H, H, H, eps))
		}
	}
	for k := range fs {
		ws := s.ranks[k].ws
		v0 := s.plans[k].vocab.lo
		if N > 1 {
			o.do(o.b.zero(ws.logits, int64(4*M*V)))
		}
		if want == nil {
			o.lin(in[k].head, fptr(ws.logits, v0), in[k].hid, M, H, V)
			continue
		}
		for i := 0; i < M; i++ {
			if want[i] {
				o.lin(in[k].head, fptr(ws.logits, i*V+v0), fptr(in[k].hid, i*H), 1, H, V)
			}
		}
	}
	allReduce(func(w *workspace) cuda.DevPtr { return w.logits }, M*V)
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
			logits = append(logits, e0.downloadRows(c.o, e0.ws.logits, hi-lo, V)...)
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
				mtp = append(mtp, e0.downloadRows(c.o, e0.ws.logits, n, V)...)
			}
			if c.o.err != nil {
				return c.o.err
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
