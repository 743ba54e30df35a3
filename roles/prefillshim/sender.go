package prefillshim

import (
	"context"
	"log/slog"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/handoff"
	"github.com/tilert-go/tilert/internal/netguard"
	"github.com/tilert-go/tilert/pd"
	"github.com/tilert-go/tilert/rdma"
)

// Options configure a Sidecar.
type Options struct {
	// StagingDir is where the plugin writes staging files; only files
	// directly inside it are accepted (and deleted).
	StagingDir string
	// StagingBytes bounds the staged bytes waiting or in flight; a stage
	// that would pass it is refused with staging_full.
	StagingBytes int64
	// Transfer is the sending transfer engine (the decode nodes' kind).
	Transfer rdma.Engine
	// Device maps and reads vLLM's GPU caches for the zero-copy path; nil
	// turns it off (the plugin then stages through /dev/shm).
	Device DeviceAccess
	// Workers is how many requests are sent at once (default 4).
	Workers int
	// QueueLen bounds the queued requests (default 1024).
	QueueLen int
	// BusyRetryFor is how long a request keeps retrying admits the node
	// refuses as busy (default 30 s).
	BusyRetryFor time.Duration
	// SendTimeout bounds one attempt: dial, admit, writes, done (default 60 s).
	SendTimeout time.Duration
	// IdlePerNode is the idle ctrl connections kept per decode node
	// (default Workers).
	IdlePerNode int
	// Secret is proven to every decode node's ctrl port (and its transfer
	// streams, through Transfer's own config); nil: nodes without a secret.
	Secret []byte
	// Socket bounds the plugin socket: connections at once (MaxConns),
	// the wait between frames (IdleTimeout), a started frame (ReadTimeout),
	// a reply (WriteTimeout) and a frame's size (MaxFrame). Zero: pd's
	// defaults.
	Socket pd.Security
	Log    *slog.Logger
	// dial replaces pd.Dial in tests.
	dial func(ctx context.Context, addr string, eng rdma.Engine) (*pd.Client, error)
}

func (o *Options) defaults() {
	if o.Workers <= 0 {
		o.Workers = 4
	}
	if o.QueueLen <= 0 {
		o.QueueLen = 1024
	}
	if o.BusyRetryFor <= 0 {
		o.BusyRetryFor = 30 * time.Second
	}
	if o.SendTimeout <= 0 {
		o.SendTimeout = 60 * time.Second
	}
	if o.IdlePerNode <= 0 {
		o.IdlePerNode = o.Workers
	}
	if o.Log == nil {
		o.Log = slog.Default()
	}
	o.Socket.Defaults()
	if o.dial == nil {
		secret := o.Secret
		o.dial = func(ctx context.Context, addr string, eng rdma.Engine) (*pd.Client, error) {
			return pd.Dial(ctx, addr, eng, pd.Layout{}, pd.WithSecret(secret))
		}
	}
}

// Outcome labels of tilert_sidecar_requests_total; every stage ends with
// exactly one.
const (
	OutcomeOK             = "ok"
	OutcomeBusyTimeout    = "busy_timeout"    // the node stayed busy past BusyRetryFor
	OutcomeRejected       = "rejected_"       // + the reject reason (too_long, layout_mismatch, cancelling, bad_request)
	OutcomeAckFailed      = "ack_"            // + the ack error (stale, size_mismatch, checksum_mismatch)
	OutcomeConnectFailed  = "connect_failed"  // dial, hello or transfer-engine connect
	OutcomeTransferFailed = "transfer_failed" // writes or ctrl I/O after accept
	OutcomeStagingError   = "staging_error"   // the staging file could not be mapped or registered
	OutcomeBadRequest     = "bad_request"     // refused on the socket
	OutcomeStagingFull    = "staging_full"
	OutcomeQueueFull      = "queue_full"
	OutcomeShuttingDown   = "shutting_down"
	OutcomeAborted        = "aborted" // the sidecar stopped before the send finished
)

type job struct {
	st       *Stage
	blocks   *blockJob // the zero-copy path: st has no file
	received time.Time
}

// Sidecar takes stages from the plugin socket and ships them to decode
// nodes in the background.
type Sidecar struct {
	o Options
	m *sidecarMetrics

	queue    chan *job
	guard    atomic.Pointer[netguard.Listener] // the socket's connection cap (tests read it)
	staged   atomic.Int64
	inflight atomic.Int64
	regionID atomic.Uint64

	mu       sync.Mutex
	closing  bool
	idle     map[string][]pooled
	workerWG sync.WaitGroup
	ctx      context.Context
	cancel   context.CancelFunc
}

// New starts a sidecar's senders. Serve it on a listener; Close drains it.
func New(o Options) (*Sidecar, error) {
	o.defaults()
	if o.Transfer == nil {
		return nil, errors.New("sidecar: no transfer engine")
	}
	if o.StagingDir == "" || o.StagingBytes <= 0 {
		return nil, errors.Newf("sidecar: staging dir %q, staging bytes %d", o.StagingDir, o.StagingBytes)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Sidecar{o: o, queue: make(chan *job, o.QueueLen), idle: map[string][]pooled{}, ctx: ctx, cancel: cancel}
	s.m = newMetrics(s)
	for i := 0; i < o.Workers; i++ {
		s.workerWG.Add(1)
		go s.worker()
	}
	return s, nil
}

// Serve accepts plugin connections on ln until ln is closed, at most
// Options.Socket.MaxConns at once.
func (s *Sidecar) Serve(ln net.Listener) error {
	g := netguard.Wrap(ln, netguard.Limits{MaxConns: s.o.Socket.MaxConns, Name: "sidecar socket"})
	s.guard.Store(g)
	ln = g
	for {
		conn, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			return errors.Wrap(err, "sidecar: accept")
		}
		go s.serveConn(conn)
	}
}

// Close stops taking stages, waits up to grace for the queued ones to be
// sent, then aborts the rest (each logged and counted as aborted).
func (s *Sidecar) Close(grace time.Duration) {
	s.mu.Lock()
	if s.closing {
		s.mu.Unlock()
		return
	}
	s.closing = true
	close(s.queue)
	s.mu.Unlock()
	done := make(chan struct{})
	go func() { s.workerWG.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(grace):
		s.cancel()
		<-done
	}
	s.cancel()
	s.mu.Lock()
	for _, cs := range s.idle {
		for _, c := range cs {
			_ = c.c.Close()
		}
	}
	s.idle = map[string][]pooled{}
	s.mu.Unlock()
}

// enqueue validates a stage and queues it, or refuses it (deleting its
// staging file when that file is one the sidecar may touch).
func (s *Sidecar) enqueue(st *Stage) Reply {
	refuse := func(code, outcome string, err error) Reply {
		s.m.frames.With(code).Inc()
		s.finish(st, outcome, err, time.Time{})
		return Reply{Type: TypeError, RID: st.RID, Error: code, Message: err.Error()}
	}
	if err := st.validate(s.o.StagingDir); err != nil {
		return refuse(ErrCodeBadRequest, OutcomeBadRequest, err)
	}
	if err := st.checkFile(); err != nil {
		return refuse(ErrCodeBadRequest, OutcomeBadRequest, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closing {
		return refuse(ErrCodeShuttingDown, OutcomeShuttingDown, errors.New("the sidecar is shutting down"))
	}
	if n := s.staged.Add(st.FileBytes); n > s.o.StagingBytes {
		s.staged.Add(-st.FileBytes)
		return refuse(ErrCodeStagingFull, OutcomeStagingFull,
			errors.Newf("%d staged bytes + %d would pass the %d-byte staging limit (sidecar.staging_mib)", n-st.FileBytes, st.FileBytes, s.o.StagingBytes))
	}
	select {
	case s.queue <- &job{st: st, received: time.Now()}:
	default:
		s.staged.Add(-st.FileBytes)
		return refuse(ErrCodeStagingFull, OutcomeQueueFull, errors.Newf("%d requests already queued", cap(s.queue)))
	}
	s.o.Log.Debug("sidecar: queued", "rid", st.RID, "node", st.Ctrl(), "bytes", st.FileBytes, "seq_len", st.SeqLen)
	return Reply{Type: TypeQueued, RID: st.RID, QueueDepth: len(s.queue)}
}

// finish ends a stage: deletes its staging file (only when the path is
// inside the staging dir), logs the outcome and counts it.
func (s *Sidecar) finish(st *Stage, outcome string, err error, received time.Time) {
	if checkPath(st.Path, s.o.StagingDir) == nil {
		if rerr := os.Remove(st.Path); rerr != nil && !os.IsNotExist(rerr) {
			s.o.Log.Warn("sidecar: could not delete the staging file", "rid", st.RID, "path", st.Path, "err", rerr)
		}
	}
	s.m.requests.With(outcome).Inc()
	if outcome == OutcomeOK {
		s.m.bytes.Add(float64(st.FileBytes))
		s.m.seconds.With().Observe(time.Since(received).Seconds())
		s.o.Log.Info("sidecar: state shipped", "rid", st.RID, "node", st.Ctrl(), "bytes", st.FileBytes, "seq_len", st.SeqLen,
			"took", time.Since(received).Round(time.Microsecond))
		return
	}
	s.o.Log.Error("sidecar: request not shipped", "rid", st.RID, "node", st.Ctrl(), "outcome", outcome, "err", err)
}

func (s *Sidecar) worker() {
	defer s.workerWG.Done()
	for j := range s.queue {
		s.inflight.Add(1)
		var outcome string
		var err error
		if j.blocks != nil {
			if s.ctx.Err() != nil {
				outcome, err = OutcomeAborted, errors.New("the sidecar stopped before the send started")
			} else {
				outcome, err = s.shipBlocks(j.blocks)
			}
			j.blocks.cache.release(j.blocks.sb.Tag)
			s.m.zeroCopy.With(outcome).Inc()
		} else {
			outcome, err = s.ship(j.st)
			s.staged.Add(-j.st.FileBytes)
		}
		s.inflight.Add(-1)
		s.finish(j.st, outcome, err, j.received)
	}
}

// ship sends one staged request: map and register the file, then admit /
// write / done on a pooled ctrl connection, retrying while the node is busy.
func (s *Sidecar) ship(st *Stage) (string, error) {
	f, err := os.OpenFile(st.Path, os.O_RDWR, 0)
	if err != nil {
		return OutcomeStagingError, errors.Wrapf(err, "staging file %s", st.Path)
	}
	// Read-write and shared: RDMA registration wants writable pages.
	buf, err := syscall.Mmap(int(f.Fd()), 0, int(st.FileBytes), syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
	_ = f.Close()
	if err != nil {
		return OutcomeStagingError, errors.Wrapf(err, "mmap staging file %s", st.Path)
	}
	defer func() { _ = syscall.Munmap(buf) }()
	id := rdma.RegionID(s.regionID.Add(1))
	if err := s.o.Transfer.Register(rdma.Region{ID: id, Kind: rdma.HostMem, Host: buf}); err != nil {
		return OutcomeStagingError, errors.Wrapf(err, "register staging file %s", st.Path)
	}
	defer func() { _ = s.o.Transfer.Deregister(id) }()

	regs := st.ordered()
	mtpLen := st.MTPLen
	admit := &pd.Admit{RID: st.RID, Model: st.Model, LayoutVersion: handoff.LayoutVersion, KVCacheDType: st.KVCacheDType,
		NumLayers: st.numLayers(), SeqLen: st.SeqLen, MTPLen: &mtpLen, LastPromptToken: st.LastPromptToken, PromptTokenIDs: st.PromptTokenIDs}
	srcs := make([]pd.Source, len(regs))
	for i, r := range regs {
		admit.Regions = append(admit.Regions, pd.RegionSize{Name: regionName(r), Bytes: r.Bytes})
		srcs[i] = pd.Source{Name: regionName(r), Region: id, Offset: r.Offset, Host: buf[r.Offset : r.Offset+r.Bytes]}
	}
	return s.sendAttempts(st, admit, func(ctx context.Context, c *pd.Client, acc *pd.Accept) error {
		n, crc, err := c.Write(ctx, acc, srcs)
		if err != nil {
			return err
		}
		_, err = c.Done(ctx, acc, n, crc)
		return err
	})
}

// sendAttempts admits st on a pooled ctrl connection and runs write (the
// writes and done) on the accept, retrying while the node is busy.
func (s *Sidecar) sendAttempts(st *Stage, admit *pd.Admit, write func(ctx context.Context, c *pd.Client, acc *pd.Accept) error) (string, error) {
	addr := st.Ctrl()
	busyUntil := time.Now().Add(s.o.BusyRetryFor)
	freshTried := false
	for attempt := 1; ; attempt++ {
		if s.ctx.Err() != nil {
			return OutcomeAborted, errors.New("the sidecar stopped before the send finished")
		}
		c, pooled, err := s.client(addr)
		if err != nil {
			return OutcomeConnectFailed, err
		}
		ctx, cancel := context.WithTimeout(s.ctx, s.o.SendTimeout)
		a := *admit
		a.Regions = append([]pd.RegionSize(nil), admit.Regions...)
		acc, err := c.Admit(ctx, &a)
		if err == nil {
			err = write(ctx, c, acc)
		}
		cancel()
		if err == nil {
			s.release(addr, c)
			return OutcomeOK, nil
		}
		var rej *pd.RejectError
		if errors.As(err, &rej) {
			s.release(addr, c) // a reject leaves the connection usable
			if !rej.Retryable() {
				return OutcomeRejected + rej.Reject.Error, err
			}
			wait := time.Duration(rej.Reject.RetryAfterMS) * time.Millisecond
			wait = min(max(wait, 5*time.Millisecond), time.Second)
			if time.Now().Add(wait).After(busyUntil) {
				return OutcomeBusyTimeout, errors.Wrapf(err, "still busy after %d attempts over %s", attempt, s.o.BusyRetryFor)
			}
			s.m.retries.With("busy").Inc()
			select {
			case <-time.After(wait):
			case <-s.ctx.Done():
			}
			continue
		}
		_ = c.Close()
		var ack *pd.AckError
		if errors.As(err, &ack) {
			return OutcomeAckFailed + ack.Ack.Error, err
		}
		// A pooled connection the node has since closed fails on first
		// use; one fresh connection gets a second chance.
		if pooled && !freshTried {
			freshTried = true
			s.m.retries.With("stale_connection").Inc()
			continue
		}
		return OutcomeTransferFailed, err
	}
}

// pooled is an idle ctrl connection and when it went idle.
type pooled struct {
	c  *pd.Client
	at time.Time
}

// client returns an idle ctrl connection to addr or dials one.
func (s *Sidecar) client(addr string) (*pd.Client, bool, error) {
	s.mu.Lock()
	// Nodes close ctrl connections (and transfer streams) idle past their
	// security.idle_timeout_s; one idle for half of ours is dropped rather
	// than tried.
	for cs := s.idle[addr]; len(cs) > 0; cs = s.idle[addr] {
		p := cs[len(cs)-1]
		s.idle[addr] = cs[:len(cs)-1]
		if time.Since(p.at) > s.o.Socket.IdleTimeout/2 {
			_ = p.c.Close()
			continue
		}
		s.mu.Unlock()
		return p.c, true, nil
	}
	s.mu.Unlock()
	ctx, cancel := context.WithTimeout(s.ctx, 10*time.Second)
	defer cancel()
	c, err := s.o.dial(ctx, addr, s.o.Transfer)
	if err != nil {
		return nil, false, err
	}
	s.m.dials.Inc()
	return c, false, nil
}

func (s *Sidecar) release(addr string, c *pd.Client) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closing && s.ctx.Err() != nil || len(s.idle[addr]) >= s.o.IdlePerNode {
		_ = c.Close()
		return
	}
	s.idle[addr] = append(s.idle[addr], pooled{c: c, at: time.Now()})
}
