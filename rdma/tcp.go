package rdma

import (
	"bufio"
	"context"
	"encoding/binary"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/internal/auth"
	"github.com/tilert-go/tilert/internal/netguard"
)

// TCP engine wire format (every integer big-endian), per stream:
//
//	sender -> receiver, once:  8-byte magic "TLRTWR02"
//	receiver -> sender, once:  32-byte nonce
//	sender -> receiver, once:  session length u16 | session | 32-byte mac
//	    mac = HMAC-SHA256(secret, "tilert-tcp v2 stream", nonce, session)
//	receiver -> sender, once:  1 byte, 0 accepted, 1 refused (then close)
//	sender -> receiver, per write: 40-byte header
//	    seq u64 | region u32 | flags u32 (0) | key u64 | offset u64 | len u64
//	  followed by len payload bytes
//	receiver -> sender, per write, in the order received: 16-byte completion
//	    seq u64 | status u32 | reserved u32
//
// The receiver reads the payload straight into the registered region, in
// chunks; before each chunk it checks, under the region's lock, that the
// region is open for exactly this key, so Revoke waits at most one chunk.
// Refused payloads are read and dropped so the stream stays in sync.
const (
	tcpMagic      = "TLRTWR02"
	tcpMACLabel   = "tilert-tcp v2 stream"
	tcpMaxSession = 256
	tcpHeaderLen  = 40
	tcpComplLen   = 16
	tcpStatusOK   = 0
	tcpStatusNoRe = 1 // unknown region
	tcpStatusKey  = 2 // region not open for this key
	tcpStatusOOB  = 3 // range outside the region
	tcpStatusCut  = 4 // revoked while the payload was arriving
)

func tcpStatusError(st uint32) error {
	switch st {
	case tcpStatusOK:
		return nil
	case tcpStatusNoRe:
		return errors.Wrap(ErrRefused, "unknown region")
	case tcpStatusKey:
		return errors.Wrap(ErrRefused, "region not open for this key (stale or future generation)")
	case tcpStatusOOB:
		return errors.Wrap(ErrRefused, "range outside the region")
	case tcpStatusCut:
		return errors.Wrap(ErrRefused, "region revoked during the write")
	}
	return errors.Wrapf(ErrRefused, "status %d", st)
}

// TCPConfig configures the built-in engine.
type TCPConfig struct {
	// Listen is the data address to accept writes on ("127.0.0.1:0").
	// Empty: send-only engine.
	Listen string
	// Advertise is the host:port peers dial; default the listener's address.
	Advertise string
	// Streams is the number of TCP connections per peer (default 4).
	Streams int
	// PieceBytes splits large writes so they spread over the streams
	// (default 4 MiB).
	PieceBytes int64
	// ChunkBytes is the receiver's unit between permission checks
	// (default 1 MiB).
	ChunkBytes int64
	// IOTimeout bounds one chunk's arrival, so a stalled sender cannot hold
	// a region against Revoke forever (default 30 s).
	IOTimeout time.Duration
	// Window is the number of pieces in flight per stream (default 32).
	Window int
	// Secret is the shared secret streams prove at their handshake (both
	// ends); nil on both ends is an unauthenticated deployment.
	Secret []byte
	// MaxConns and MaxConnsPerPeer cap the receiver's streams in total and
	// per remote IP (security.max_conns, max_conns_per_peer; 0: no cap).
	MaxConns, MaxConnsPerPeer int
	// HandshakeTimeout bounds the handshake and a started write header
	// (security.read_timeout_s, default 10 s).
	HandshakeTimeout time.Duration
	// IdleTimeout closes a stream with no write for this long
	// (security.idle_timeout_s, default 5 min).
	IdleTimeout time.Duration
	// DeviceReader, when set, lets the engine send from device memory
	// (Region.Kind DeviceMem): it reads the bytes through host buffers of
	// DeviceStagingBytes (default 8 MiB), the next chunk while the current
	// one is sent. Receiving into device memory is not supported.
	DeviceReader       DeviceReader
	DeviceStagingBytes int64
}

func (c *TCPConfig) defaults() {
	if c.Streams <= 0 {
		c.Streams = 4
	}
	if c.PieceBytes <= 0 {
		c.PieceBytes = 4 << 20
	}
	if c.ChunkBytes <= 0 {
		c.ChunkBytes = 1 << 20
	}
	if c.IOTimeout <= 0 {
		c.IOTimeout = 30 * time.Second
	}
	if c.Window <= 0 {
		c.Window = 32
	}
	if c.HandshakeTimeout <= 0 {
		c.HandshakeTimeout = 10 * time.Second
	}
	if c.IdleTimeout <= 0 {
		c.IdleTimeout = 5 * time.Minute
	}
	if c.DeviceStagingBytes <= 0 {
		c.DeviceStagingBytes = 8 << 20
	}
}

type tcpRegion struct {
	Region
	mu   sync.RWMutex // writers of payload chunks hold it shared; Open/Revoke exclusive
	key  uint64       // 0: closed
	peer string       // "": any authenticated stream; else only this session's
}

// TCPEngine is the built-in transfer engine.
type TCPEngine struct {
	cfg TCPConfig
	ln  net.Listener

	mu      sync.RWMutex
	regions map[RegionID]*tcpRegion
	conns   map[net.Conn]struct{}
	peers   map[*tcpPeer]struct{}
	closed  bool
	wg      sync.WaitGroup

	devStage *deviceStaging // nil without cfg.DeviceReader
}

// NewTCP starts a TCP engine, listening when cfg.Listen is set.
func NewTCP(cfg TCPConfig) (*TCPEngine, error) {
	cfg.defaults()
	e := &TCPEngine{cfg: cfg, regions: map[RegionID]*tcpRegion{}, conns: map[net.Conn]struct{}{}, peers: map[*tcpPeer]struct{}{}}
	if cfg.DeviceReader != nil {
		e.devStage = &deviceStaging{r: cfg.DeviceReader, bytes: int(cfg.DeviceStagingBytes)}
	}
	if cfg.Listen != "" {
		ln, err := net.Listen("tcp", cfg.Listen)
		if err != nil {
			return nil, errors.Wrapf(err, "rdma/tcp: listen on %s", cfg.Listen)
		}
		e.ln = netguard.Wrap(ln, netguard.Limits{MaxConns: cfg.MaxConns, MaxPerPeer: cfg.MaxConnsPerPeer, Name: "transfer"})
		e.wg.Add(1)
		go e.acceptLoop()
	}
	return e, nil
}

// Kind implements Engine.
func (e *TCPEngine) Kind() string { return "tcp" }

// Endpoint implements Engine: "tcp://host:port", empty for a send-only engine.
func (e *TCPEngine) Endpoint() string {
	if e.ln == nil {
		return ""
	}
	if e.cfg.Advertise != "" {
		return "tcp://" + e.cfg.Advertise
	}
	return "tcp://" + e.ln.Addr().String()
}

// Register implements Engine. Host memory; device memory only as a write
// source, and only with a DeviceReader (TCPConfig).
func (e *TCPEngine) Register(r Region) error {
	if r.Kind == "" {
		r.Kind = HostMem
	}
	if err := r.validate(); err != nil {
		return err
	}
	if r.Kind != HostMem && (r.Kind != DeviceMem || e.devStage == nil) {
		return errors.WithHint(errors.Newf("rdma/tcp: region %d: %s memory is not supported", r.ID, r.Kind),
			"register a host staging buffer, give the engine a DeviceReader (send side), or use the nixl engine for device memory")
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return ErrClosed
	}
	if _, ok := e.regions[r.ID]; ok {
		return errors.Newf("rdma/tcp: region %d already registered", r.ID)
	}
	e.regions[r.ID] = &tcpRegion{Region: r}
	return nil
}

// Deregister implements Engine.
func (e *TCPEngine) Deregister(id RegionID) error {
	if err := e.Revoke(id); err != nil {
		return err
	}
	e.mu.Lock()
	delete(e.regions, id)
	e.mu.Unlock()
	return nil
}

func (e *TCPEngine) region(id RegionID) *tcpRegion {
	e.mu.RLock()
	r := e.regions[id]
	e.mu.RUnlock()
	return r
}

// Open implements Engine.
func (e *TCPEngine) Open(id RegionID, key uint64) (Remote, error) { return e.OpenFor(id, key, "") }

// OpenFor implements PeerOpener: writes must carry key and, when session is
// set, come on streams that introduced themselves with that session.
func (e *TCPEngine) OpenFor(id RegionID, key uint64, session string) (Remote, error) {
	if key == 0 {
		return Remote{}, errors.Newf("rdma/tcp: open region %d: key must be non-zero", id)
	}
	r := e.region(id)
	if r == nil {
		return Remote{}, errors.Newf("rdma/tcp: open: region %d not registered", id)
	}
	r.mu.Lock()
	r.key, r.peer = key, session
	r.mu.Unlock()
	return Remote{ID: id, Key: key, Len: r.Size(), Kind: r.Kind}, nil
}

// Revoke implements Engine.
func (e *TCPEngine) Revoke(id RegionID) error {
	r := e.region(id)
	if r == nil {
		return errors.Newf("rdma/tcp: revoke: region %d not registered", id)
	}
	r.mu.Lock()
	r.key, r.peer = 0, ""
	r.mu.Unlock()
	return nil
}

// Close implements Engine.
func (e *TCPEngine) Close() error {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return nil
	}
	e.closed = true
	for c := range e.conns {
		_ = c.Close()
	}
	peers := make([]*tcpPeer, 0, len(e.peers))
	for p := range e.peers {
		peers = append(peers, p)
	}
	e.mu.Unlock()
	var err error
	if e.ln != nil {
		err = e.ln.Close()
	}
	for _, p := range peers {
		_ = p.Close()
	}
	e.wg.Wait()
	if e.devStage != nil {
		err = errors.CombineErrors(err, e.devStage.close())
	}
	return err
}

func (e *TCPEngine) acceptLoop() {
	defer e.wg.Done()
	for {
		c, err := e.ln.Accept()
		if err != nil {
			return
		}
		e.mu.Lock()
		if e.closed {
			e.mu.Unlock()
			_ = c.Close()
			return
		}
		e.conns[c] = struct{}{}
		e.wg.Add(1)
		e.mu.Unlock()
		go e.serveStream(c)
	}
}

// serveStream is the receiving end of one stream.
func (e *TCPEngine) serveStream(c net.Conn) {
	defer e.wg.Done()
	defer func() {
		e.mu.Lock()
		delete(e.conns, c)
		e.mu.Unlock()
		_ = c.Close()
	}()
	br := bufio.NewReaderSize(c, 64<<10)
	var hdr [tcpHeaderLen]byte
	var compl [tcpComplLen]byte
	session, ok := e.handshake(c, br)
	if !ok {
		return
	}
	for {
		// An idle stream is closed after IdleTimeout; a started header
		// must complete within HandshakeTimeout (slowloris).
		_ = c.SetReadDeadline(time.Now().Add(e.cfg.IdleTimeout))
		if _, err := br.Peek(1); err != nil {
			return
		}
		_ = c.SetReadDeadline(time.Now().Add(e.cfg.HandshakeTimeout))
		if _, err := io.ReadFull(br, hdr[:]); err != nil {
			return
		}
		seq := binary.BigEndian.Uint64(hdr[0:])
		id := RegionID(binary.BigEndian.Uint32(hdr[8:]))
		key := binary.BigEndian.Uint64(hdr[16:])
		off := binary.BigEndian.Uint64(hdr[24:])
		n := binary.BigEndian.Uint64(hdr[32:])
		st, err := e.receive(c, br, session, id, key, off, n)
		if err != nil {
			return // the stream is broken; the sender sees it
		}
		binary.BigEndian.PutUint64(compl[0:], seq)
		binary.BigEndian.PutUint32(compl[8:], st)
		_ = c.SetWriteDeadline(time.Now().Add(e.cfg.IOTimeout))
		if _, err := c.Write(compl[:]); err != nil {
			return
		}
	}
}

// handshake checks the stream's magic and its proof of the secret, and
// returns the ctrl session the stream introduced itself with.
func (e *TCPEngine) handshake(c net.Conn, br *bufio.Reader) (string, bool) {
	_ = c.SetDeadline(time.Now().Add(e.cfg.HandshakeTimeout))
	defer func() { _ = c.SetDeadline(time.Time{}) }()
	var magic [len(tcpMagic)]byte
	if _, err := io.ReadFull(br, magic[:]); err != nil || string(magic[:]) != tcpMagic {
		slog.Debug("rdma/tcp: stream without the engine's magic, closing", "remote", c.RemoteAddr())
		return "", false
	}
	nonce := auth.Nonce()
	if _, err := c.Write(nonce); err != nil {
		return "", false
	}
	var n [2]byte
	if _, err := io.ReadFull(br, n[:]); err != nil {
		return "", false
	}
	sl := int(binary.BigEndian.Uint16(n[:]))
	if sl > tcpMaxSession {
		return "", false
	}
	buf := make([]byte, sl+32)
	if _, err := io.ReadFull(br, buf); err != nil {
		return "", false
	}
	session, mac := buf[:sl], buf[sl:]
	if !auth.Equal(mac, auth.MAC(e.cfg.Secret, tcpMACLabel, nonce, session)) {
		slog.Warn("rdma/tcp: stream refused: wrong secret (security.secret_file differs)", "remote", c.RemoteAddr().String())
		_, _ = c.Write([]byte{1})
		return "", false
	}
	if _, err := c.Write([]byte{0}); err != nil {
		return "", false
	}
	return string(session), true
}

// receive lands one write's payload (or drops it) and returns its status.
// A non-nil error means the stream itself failed.
func (e *TCPEngine) receive(c net.Conn, br *bufio.Reader, session string, id RegionID, key, off, n uint64) (uint32, error) {
	r := e.region(id)
	if r == nil {
		return tcpStatusNoRe, e.discard(c, br, n)
	}
	size := uint64(r.Size())
	if off > size || n > size-off || r.Kind == DeviceMem {
		return tcpStatusOOB, e.discard(c, br, n)
	}
	done := uint64(0)
	for done < n {
		k := min(n-done, uint64(e.cfg.ChunkBytes))
		r.mu.RLock()
		if r.key == 0 || r.key != key || (r.peer != "" && r.peer != session) {
			r.mu.RUnlock()
			st := uint32(tcpStatusKey)
			if done > 0 {
				st = tcpStatusCut
			}
			return st, e.discard(c, br, n-done)
		}
		_ = c.SetReadDeadline(time.Now().Add(e.cfg.IOTimeout))
		dst := r.Host[off+done : off+done+k]
		_, err := io.ReadFull(br, dst)
		r.mu.RUnlock()
		if err != nil {
			return 0, err
		}
		done += k
	}
	return tcpStatusOK, nil
}

func (e *TCPEngine) discard(c net.Conn, br *bufio.Reader, n uint64) error {
	for n > 0 {
		k := min(n, 1<<20)
		_ = c.SetReadDeadline(time.Now().Add(e.cfg.IOTimeout))
		if _, err := br.Discard(int(k)); err != nil {
			return err
		}
		n -= k
	}
	return nil
}

// Connect implements Engine.
func (e *TCPEngine) Connect(ctx context.Context, endpoint string) (Peer, error) {
	return e.ConnectAs(ctx, endpoint, "")
}

// ConnectAs implements SessionConnector: every stream proves the secret and
// introduces itself with session.
func (e *TCPEngine) ConnectAs(ctx context.Context, endpoint, session string) (Peer, error) {
	if len(session) > tcpMaxSession {
		return nil, errors.Newf("rdma/tcp: session of %d bytes, at most %d", len(session), tcpMaxSession)
	}
	addr, ok := strings.CutPrefix(endpoint, "tcp://")
	if !ok {
		return nil, errors.WithHint(errors.Newf("rdma/tcp: endpoint %q is not tcp://host:port", endpoint),
			"the decode node's hello names its transport; both sides must use the same engine kind")
	}
	p := &tcpPeer{e: e}
	var d net.Dialer
	for i := 0; i < e.cfg.Streams; i++ {
		c, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			_ = p.Close()
			return nil, errors.Wrapf(err, "rdma/tcp: connect stream %d to %s", i, addr)
		}
		if err := e.introduce(ctx, c, session); err != nil {
			_ = c.Close()
			_ = p.Close()
			return nil, errors.Wrapf(err, "rdma/tcp: connect stream %d to %s", i, addr)
		}
		s := &tcpStream{c: c, sem: make(chan struct{}, e.cfg.Window), dead: make(chan struct{})}
		p.streams = append(p.streams, s)
		p.wg.Add(1)
		go s.readCompletions(&p.wg)
	}
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		_ = p.Close()
		return nil, ErrClosed
	}
	e.peers[p] = struct{}{}
	e.mu.Unlock()
	return p, nil
}

// introduce runs the sender's side of the stream handshake.
func (e *TCPEngine) introduce(ctx context.Context, c net.Conn, session string) error {
	dl := time.Now().Add(e.cfg.HandshakeTimeout)
	if d, ok := ctx.Deadline(); ok && d.Before(dl) {
		dl = d
	}
	_ = c.SetDeadline(dl)
	defer func() { _ = c.SetDeadline(time.Time{}) }()
	if _, err := c.Write([]byte(tcpMagic)); err != nil {
		return err
	}
	nonce := make([]byte, auth.NonceBytes)
	if _, err := io.ReadFull(c, nonce); err != nil {
		return errors.Wrap(err, "reading the receiver's challenge (is it a tilert transfer port of this version?)")
	}
	msg := make([]byte, 0, 2+len(session)+32)
	msg = binary.BigEndian.AppendUint16(msg, uint16(len(session)))
	msg = append(msg, session...)
	msg = append(msg, auth.MAC(e.cfg.Secret, tcpMACLabel, nonce, []byte(session))...)
	if _, err := c.Write(msg); err != nil {
		return err
	}
	var st [1]byte
	if _, err := io.ReadFull(c, st[:]); err != nil || st[0] != 0 {
		return errors.WithHint(errors.Mark(errors.New("rdma/tcp: the receiver refused this stream's proof of the secret"), ErrUnauthorized),
			"give the decode node and this side the same security.secret_file (or none on both)")
	}
	return nil
}

type tcpPeer struct {
	e       *TCPEngine
	streams []*tcpStream
	next    atomic.Uint32
	once    sync.Once
	wg      sync.WaitGroup
}

// batch tracks one Write call's pieces.
type batch struct {
	left atomic.Int64
	mu   sync.Mutex
	err  error
	done chan struct{}
}

func (b *batch) complete(err error) {
	if err != nil {
		b.mu.Lock()
		if b.err == nil {
			b.err = err
		}
		b.mu.Unlock()
	}
	if b.left.Add(-1) == 0 {
		close(b.done)
	}
}

type pending struct {
	seq uint64
	b   *batch
}

type tcpStream struct {
	c    net.Conn
	sem  chan struct{} // pieces in flight
	dead chan struct{} // closed when the stream failed

	sendMu sync.Mutex // one header+payload at a time
	seq    uint64     // guarded by sendMu
	hdr    [tcpHeaderLen]byte
	bufs   net.Buffers

	qmu    sync.Mutex
	queue  []pending // awaiting completion, in send order
	broken error
}

// Write implements Peer.
func (p *tcpPeer) Write(ctx context.Context, ops []WriteOp) error {
	total := int64(0)
	var devOps []*WriteOp
	for i := range ops {
		op := &ops[i]
		lr := p.e.region(op.Local)
		if lr == nil {
			return errors.Newf("rdma/tcp: %s: local region %d not registered", op, op.Local)
		}
		if err := checkRange("local", op.Local, op.LocalOff, op.Len, lr.Size()); err != nil {
			return err
		}
		if err := checkRange("remote", op.Remote.ID, op.RemoteOff, op.Len, op.Remote.Len); err != nil {
			return err
		}
		if lr.Kind == DeviceMem {
			devOps = append(devOps, op)
			continue
		}
		total += (op.Len + p.e.cfg.PieceBytes - 1) / p.e.cfg.PieceBytes
	}
	var chunks []*devChunk
	if len(devOps) > 0 {
		chunks = chunkDeviceOps(devOps, p.e.region, p.e.cfg.DeviceStagingBytes, p.e.cfg.PieceBytes)
		for _, c := range chunks {
			total += int64(len(c.pieces))
		}
	}
	if total == 0 {
		return nil
	}
	b := &batch{done: make(chan struct{})}
	b.left.Store(total)
	sent := int64(0)
	fail := func(err error) error {
		// Pieces never sent count as failed so the batch can finish.
		for ; sent < total; sent++ {
			b.complete(err)
		}
		<-b.done
		return b.err
	}
	for i := range ops {
		op := &ops[i]
		lr := p.e.region(op.Local)
		if lr.Kind == DeviceMem {
			continue
		}
		for o := int64(0); o < op.Len; o += p.e.cfg.PieceBytes {
			n := min(p.e.cfg.PieceBytes, op.Len-o)
			s := p.streams[int(p.next.Add(1))%len(p.streams)]
			src := lr.Host[op.LocalOff+o : op.LocalOff+o+n]
			if err := s.send(ctx, b, op.Remote, uint64(op.RemoteOff+o), src); err != nil {
				return fail(err)
			}
			sent++
		}
	}
	if len(chunks) > 0 {
		n, err := p.sendDevice(ctx, b, chunks)
		sent += n
		if err != nil {
			return fail(err)
		}
	}
	select {
	case <-b.done:
		return b.err
	case <-ctx.Done():
		return errors.Wrap(ctx.Err(), "rdma/tcp: waiting for write completions")
	}
}

func (s *tcpStream) send(ctx context.Context, b *batch, rem Remote, off uint64, src []byte) error {
	select {
	case s.sem <- struct{}{}:
	case <-s.dead:
		return s.err()
	case <-ctx.Done():
		return errors.Wrap(ctx.Err(), "rdma/tcp: waiting for a send window")
	}
	s.sendMu.Lock()
	defer s.sendMu.Unlock()
	s.qmu.Lock()
	if s.broken != nil {
		err := s.broken
		s.qmu.Unlock()
		<-s.sem
		return err
	}
	s.seq++
	s.queue = append(s.queue, pending{seq: s.seq, b: b})
	s.qmu.Unlock()
	h := s.hdr[:]
	binary.BigEndian.PutUint64(h[0:], s.seq)
	binary.BigEndian.PutUint32(h[8:], uint32(rem.ID))
	binary.BigEndian.PutUint32(h[12:], 0)
	binary.BigEndian.PutUint64(h[16:], rem.Key)
	binary.BigEndian.PutUint64(h[24:], off)
	binary.BigEndian.PutUint64(h[32:], uint64(len(src)))
	s.bufs = append(s.bufs[:0], h, src)
	if _, err := s.bufs.WriteTo(s.c); err != nil {
		// The completion reader fails next and completes the queued piece.
		_ = s.c.Close()
	}
	return nil
}

func (s *tcpStream) err() error {
	s.qmu.Lock()
	defer s.qmu.Unlock()
	if s.broken == nil {
		return ErrClosed
	}
	return s.broken
}

func (s *tcpStream) readCompletions(wg *sync.WaitGroup) {
	defer wg.Done()
	br := bufio.NewReaderSize(s.c, 4096)
	var buf [tcpComplLen]byte
	var failure error
	for {
		if _, err := io.ReadFull(br, buf[:]); err != nil {
			failure = errors.Wrapf(err, "rdma/tcp: stream to %s failed", s.c.RemoteAddr())
			break
		}
		seq := binary.BigEndian.Uint64(buf[0:])
		st := binary.BigEndian.Uint32(buf[8:])
		s.qmu.Lock()
		if len(s.queue) == 0 || s.queue[0].seq != seq {
			s.qmu.Unlock()
			failure = errors.Newf("rdma/tcp: completion for unexpected write %d", seq)
			break
		}
		p := s.queue[0]
		s.queue[0] = pending{}
		s.queue = s.queue[1:]
		s.qmu.Unlock()
		<-s.sem
		p.b.complete(tcpStatusError(st))
	}
	_ = s.c.Close()
	s.qmu.Lock()
	s.broken = failure
	q := s.queue
	s.queue = nil
	s.qmu.Unlock()
	close(s.dead)
	for _, p := range q {
		<-s.sem
		p.b.complete(failure)
	}
}

// Close implements Peer.
func (p *tcpPeer) Close() error {
	p.once.Do(func() {
		for _, s := range p.streams {
			_ = s.c.Close()
		}
		p.wg.Wait()
		p.e.mu.Lock()
		delete(p.e.peers, p)
		p.e.mu.Unlock()
	})
	return nil
}
