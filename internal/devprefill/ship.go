package devprefill

import (
	"context"
	"sync"
	"time"

	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/engine"
	"github.com/tilert-go/tilert/engine/cpu"
	"github.com/tilert-go/tilert/handoff"
	"github.com/tilert-go/tilert/model"
	"github.com/tilert-go/tilert/pd"
	"github.com/tilert-go/tilert/rdma"
)

// Handoff reports one prefill whose state went to a decode node.
type Handoff struct {
	First     int                   // the token the prefill sampled
	FirstLP   *engine.TokenLogprobs // its raw logprobs, when p asked for them
	SeqLen    int                   // prompt tokens
	Ack       *pd.Ack               // the node's ack: slot and generation
	Bytes     int                   // state bytes written
	Regions   int
	Transport string
	Prefill   time.Duration
	Send      time.Duration // admit to ack
}

// Shipper prefills prompts on a local CPU engine (serving mode, vLLM's cache
// layouts) and hands each state to a decode node over the ctrl protocol and
// a transfer engine: the job vLLM + the TileRT connector + the sidecar do in
// production. It serves one prefill at a time (the CPU engine is the
// bottleneck anyway) and keeps one engine per MLA cache dtype, so weights
// are loaded once rather than per request.
type Shipper struct {
	w         model.Weights
	cfg       *model.Config
	tr        rdma.Engine
	maxSeqLen int
	secret    []byte

	mu      sync.Mutex
	engines map[engine.CacheDType]*cpu.Engine
	region  rdma.RegionID
}

// NewShipper prefills with weights w of model cfg and sends through tr.
// maxSeqLen bounds prompts (0: the model's max_position_embeddings).
func NewShipper(w model.Weights, cfg *model.Config, tr rdma.Engine, maxSeqLen int) *Shipper {
	return &Shipper{w: w, cfg: cfg, tr: tr, maxSeqLen: maxSeqLen, engines: map[engine.CacheDType]*cpu.Engine{}}
}

// WithSecret makes the Shipper prove secret to the nodes' ctrl ports
// (security.secret_file); the transfer engine carries its own copy.
func (s *Shipper) WithSecret(secret []byte) *Shipper {
	s.secret = secret
	return s
}

// Config is the model the Shipper prefills.
func (s *Shipper) Config() *model.Config { return s.cfg }

// Close releases the engines (not the transfer engine, which the caller owns).
func (s *Shipper) Close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, e := range s.engines {
		_ = e.Close()
	}
	s.engines = map[engine.CacheDType]*cpu.Engine{}
}

func (s *Shipper) engineFor(dt engine.CacheDType) (*cpu.Engine, error) {
	if e := s.engines[dt]; e != nil {
		return e, nil
	}
	e, err := cpu.New(s.cfg, s.w, engine.Options{Mode: engine.ModeServing, MLACache: dt, Slots: 1, MaxSeqLen: s.maxSeqLen})
	if err != nil {
		return nil, err
	}
	s.engines[dt] = e
	return e, nil
}

// Ship prefills prompt, then admits, writes and completes its state on the
// decode node whose ctrl port is ctrl, under rid. The node's hello decides
// the cache dtype; a layout that differs from the node's is refused before
// anything is written.
func (s *Shipper) Ship(ctx context.Context, ctrl, rid string, prompt []int, p engine.Params) (*Handoff, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	client, err := pd.Dial(ctx, ctrl, s.tr, pd.Layout{}, pd.WithSecret(s.secret))
	if err != nil {
		return nil, err
	}
	defer client.Close()
	hello := client.Hello()
	dt, err := engine.ParseCacheDType(hello.KVCacheDType)
	if err != nil {
		return nil, errors.Wrapf(err, "decode node %s", ctrl)
	}
	eng, err := s.engineFor(dt)
	if err != nil {
		return nil, err
	}
	if got := handoff.Layout(handoff.ModelName(s.cfg.Family), eng.Layout()); got != hello.Layout() {
		return nil, errors.WithHint(errors.Newf("this model's state layout %+v differs from the node's %+v", got, hello.Layout()),
			"prefill with the decode node's model")
	}
	t0 := time.Now()
	first, err := eng.Prefill(0, prompt, p)
	if err != nil {
		return nil, err
	}
	defer eng.Release(0)
	var firstLP *engine.TokenLogprobs
	if lp, ok := eng.PrefillLogprobs(0); ok {
		firstLP = &lp
	}
	meta, segs, err := eng.Export(0)
	if err != nil {
		return nil, err
	}
	tPrefill := time.Since(t0)
	s.region++
	og, err := handoff.Pack(rid, s.region, eng.Layout(), meta, segs)
	if err != nil {
		return nil, err
	}
	if err := s.tr.Register(og.Region()); err != nil {
		return nil, err
	}
	defer func() { _ = s.tr.Deregister(og.ID) }()
	t1 := time.Now()
	ack, err := client.Send(ctx, og.Admit, og.Sources)
	if err != nil {
		return nil, err
	}
	return &Handoff{First: first, FirstLP: firstLP, SeqLen: meta.SeqLen, Ack: ack, Bytes: len(og.Buf), Regions: len(og.Sources),
		Transport: s.tr.Kind(), Prefill: tPrefill, Send: time.Since(t1)}, nil
}

// Generate runs prompt to the end on the local CPU engine, as a native
// vLLM deployment would (prefill and decode in one place): the tokens
// generated (the first included) and the finish reason. `tilert dev-vllm`
// answers requests without TileRT kv_transfer_params this way, so it can
// stand in for the native pool the router spills to.
func (s *Shipper) Generate(ctx context.Context, prompt []int, p engine.Params) ([]int, engine.FinishReason, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	eng, err := s.engineFor(engine.CacheFP8DSMLA)
	if err != nil {
		return nil, "", err
	}
	first, err := eng.Prefill(0, prompt, p)
	if err != nil {
		return nil, "", err
	}
	defer eng.Release(0)
	ids := []int{first}
	fin, err := eng.Start(0, first, p)
	for err == nil && fin == engine.FinishNone {
		if err = ctx.Err(); err != nil {
			break
		}
		var res []engine.StepResult
		if res, err = eng.Step([]int{0}); err == nil {
			ids = append(ids, res[0].Tokens...)
			fin = res[0].Finish
		}
	}
	return ids, fin, err
}
