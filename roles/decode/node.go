package decode

import (
	"context"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/valyala/fasthttp"

	"github.com/tilert-go/tilert/engine"
	"github.com/tilert-go/tilert/handoff"
	"github.com/tilert-go/tilert/internal/netguard"
	"github.com/tilert-go/tilert/pd"
	"github.com/tilert-go/tilert/rdma"
)

// Options configure a Node.
type Options struct {
	// Engine is the decode engine in serving mode (caches in vLLM's
	// layouts); the node owns it from New on, through one goroutine.
	Engine engine.Engine
	// Transfer receives the state; every slot's regions are registered
	// with it.
	Transfer rdma.Engine
	// Model is the announced model name (ModelName).
	Model string
	// Device ("cuda", "cpu") and Devices (the GPU of each tensor-parallel
	// rank) are reported by /capabilities.
	Device  string
	Devices []int
	// VocabSize bounds token ids in requests.
	VocabSize int
	// EOS ends a request unless it asks for ignore_eos.
	EOS []int
	// StateTimeout is /pd/decode's default wait for state (timeout_s).
	StateTimeout time.Duration
	// ReserveDeadline is how long an accepted slot waits for done.
	ReserveDeadline time.Duration
	// ReadyTTL is how long arrived state waits for its /pd/decode.
	ReadyTTL time.Duration
	// ShutdownGrace is how long Shutdown lets requests in flight finish
	// before it cancels them (default 10 s).
	ShutdownGrace time.Duration
	// Security is authentication and limits on the ctrl and http ports.
	Security Security
	Log      *slog.Logger

	// minBatch holds the first step until this many requests have been
	// admitted (tests: makes "decoded together" deterministic).
	minBatch int
	// stepHook runs on the scheduler goroutine after each step's tokens
	// are fanned out (tests: hold the engine at a known point).
	stepHook func()
}

// Node is a decode node: slot table, ctrl server, scheduler, HTTP API.
type Node struct {
	opts   Options
	eng    engine.Engine
	layout engine.Layout
	pdl    pd.Layout
	table  *pd.Table
	ctrl   *pd.Server
	recv   *meteredReceiver
	m      *nodeMetrics
	log    *slog.Logger
	http   *fasthttp.Server
	sec    Security
	// httpGuard is the http port's connection limiter (tests read it).
	httpGuard atomic.Pointer[netguard.Listener]

	admitCh chan *request
	wake    chan struct{}
	stop    context.CancelFunc
	done    chan struct{}

	mu       sync.Mutex
	reqs     map[string]*request // rid -> request with a live /pd/decode
	draining bool
	stepMax  atomic.Int64 // largest batch decoded in one step

	closeOnce sync.Once
}

// New registers the engine's slot buffers with the transfer engine, builds
// the slot table and starts the scheduler. Serve the ctrl and HTTP ports
// with ServeCtrl and ServeHTTP.
func New(o Options) (*Node, error) {
	if o.Engine == nil || o.Transfer == nil {
		return nil, errors.New("decode: node needs an engine and a transfer engine")
	}
	if o.Engine.Options().Mode != engine.ModeServing {
		return nil, errors.Newf("decode: the engine must run in serving mode (caches in vLLM's layouts), not %q", o.Engine.Options().Mode)
	}
	if o.Log == nil {
		o.Log = slog.Default()
	}
	if o.StateTimeout <= 0 {
		o.StateTimeout = 30 * time.Second
	}
	if o.ShutdownGrace <= 0 {
		o.ShutdownGrace = 10 * time.Second
	}
	o.Security.defaults()
	n := &Node{opts: o, eng: o.Engine, layout: o.Engine.Layout(), log: o.Log, sec: o.Security,
		admitCh: make(chan *request), wake: make(chan struct{}, 1), done: make(chan struct{}), reqs: map[string]*request{}}
	n.pdl = handoff.Layout(o.Model, n.layout)
	regions, err := handoff.SlotRegions(o.Engine)
	if err != nil {
		return nil, err
	}
	g, err := pd.NewEngineReceiver(o.Transfer, regions)
	if err != nil {
		return nil, errors.Wrap(err, "decode: registering the slot buffers with the transfer engine")
	}
	n.m = newNodeMetrics(n)
	n.recv = &meteredReceiver{EngineReceiver: g, m: n.m, opened: map[int]time.Time{}}
	n.table, err = pd.NewTable(pd.TableConfig{
		Slots: o.Engine.Options().Slots, Layout: n.pdl, MaxSeqLen: o.Engine.Options().MaxSeqLen,
		Regions: g.Caps(), CheckSizes: handoff.CheckSizes(n.layout), MTP: o.Engine.Options().MTP,
		Deadline: o.ReserveDeadline, ReadyTTL: o.ReadyTTL,
		MaxRIDBytes: o.Security.MaxRIDBytes, MaxCancelled: o.Security.CancelledRIDs,
	}, n.recv)
	if err != nil {
		return nil, err
	}
	n.ctrl = pd.NewServer(n.table, pd.Transport{Kind: o.Transfer.Kind(), Endpoint: o.Transfer.Endpoint()},
		slog.New(&rejectCounter{Handler: o.Log.Handler(), m: n.m}), o.Security.Ctrl)
	n.http = n.newHTTPServer()
	ctx, cancel := context.WithCancel(context.Background())
	n.stop = cancel
	go n.schedule(ctx)
	return n, nil
}

// Table is the node's slot table.
func (n *Node) Table() *pd.Table { return n.table }

// Hello is what the ctrl port sends first.
func (n *Node) Hello() *pd.Hello { return n.ctrl.Hello() }

// ServeCtrl serves the ctrl protocol on ln until Close.
func (n *Node) ServeCtrl(ln net.Listener) error { return n.ctrl.Serve(ln) }

// ServeHTTP serves the HTTP API on ln until Close, within the connection
// caps of Options.Security.
func (n *Node) ServeHTTP(ln net.Listener) error { return n.http.Serve(n.limitListener(ln)) }

// Shutdown stops taking requests (the ctrl port closes, /pd/decode answers
// 503), lets requests in flight finish within ctx and ShutdownGrace, then
// cancels the rest and closes everything but the engine and the transfer
// engine (the caller owns those).
func (n *Node) Shutdown(ctx context.Context) error {
	var err error
	n.closeOnce.Do(func() {
		n.mu.Lock()
		n.draining = true
		n.mu.Unlock()
		_ = n.ctrl.Close()
		// With the ctrl port closed no more state arrives: requests still
		// waiting for theirs are told to go elsewhere (503).
		n.mu.Lock()
		for _, r := range n.reqs {
			if r.ready == nil {
				r.cancel()
			}
		}
		n.mu.Unlock()
		grace, cancel := context.WithTimeout(ctx, n.opts.ShutdownGrace)
		defer cancel()
		for n.inflight() > 0 && grace.Err() == nil {
			select {
			case <-grace.Done():
			case <-time.After(20 * time.Millisecond):
			}
		}
		n.mu.Lock()
		for _, r := range n.reqs {
			r.cancel()
		}
		n.mu.Unlock()
		n.poke()
		hctx, hcancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer hcancel()
		err = n.http.ShutdownWithContext(hctx)
		n.stop()
		<-n.done
	})
	return err
}

// Close is Shutdown without a grace period.
func (n *Node) Close() error {
	n.opts.ShutdownGrace = time.Nanosecond
	return n.Shutdown(context.Background())
}

func (n *Node) inflight() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return len(n.reqs)
}

// poke wakes an idle scheduler so it looks at cancellations.
func (n *Node) poke() {
	select {
	case n.wake <- struct{}{}:
	default:
	}
}

// MaxBatch is the largest number of requests decoded in one step so far.
func (n *Node) MaxBatch() int { return int(n.stepMax.Load()) }

// meteredReceiver times each reservation from accept to the checksum after done.
type meteredReceiver struct {
	*pd.EngineReceiver
	m      *nodeMetrics
	mu     sync.Mutex
	opened map[int]time.Time
}

func (g *meteredReceiver) Open(slot int, gen uint64, peer string, sizes []pd.RegionSize) ([]pd.Destination, error) {
	g.mu.Lock()
	g.opened[slot] = time.Now()
	g.mu.Unlock()
	return g.EngineReceiver.Open(slot, gen, peer, sizes)
}

// Checksum runs only for a done whose byte count matches the admit: the
// bytes have landed, so this is where a transfer is counted.
func (g *meteredReceiver) Checksum(slot int, dests []pd.Destination) (uint32, error) {
	g.mu.Lock()
	t0, ok := g.opened[slot]
	g.mu.Unlock()
	var n int64
	for _, d := range dests {
		n += d.Bytes
	}
	if ok {
		g.m.transferSeconds.With().Observe(time.Since(t0).Seconds())
	}
	g.m.transferBytes.With().Add(float64(n))
	return g.EngineReceiver.Checksum(slot, dests)
}
