package pd

import (
	"bufio"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/internal/auth"
	"github.com/tilert-go/tilert/internal/netguard"
)

// Security is what a ctrl server enforces besides the protocol. Zero
// values take the defaults of config's [security] section.
type Security struct {
	// Secret, when set, makes every connection prove it (AuthHMAC) before
	// any other message; nil serves everyone (AuthNone).
	Secret []byte
	// MaxConns and MaxConnsPerPeer cap connections in total and per
	// remote IP (defaults 1024 and 128).
	MaxConns, MaxConnsPerPeer int
	// ReadTimeout bounds the handshake and each started frame (10 s);
	// IdleTimeout the wait for the next frame (5 min); WriteTimeout one
	// reply (30 s).
	ReadTimeout, IdleTimeout, WriteTimeout time.Duration
	// MaxFrame caps frames after authentication (16 MiB).
	MaxFrame int
	// AdmitsPerS limits admits per remote IP (burst of as many); 0: none.
	AdmitsPerS float64
}

// Defaults fills zero values with the defaults.
func (s *Security) Defaults() {
	if s.MaxConns <= 0 {
		s.MaxConns = 1024
	}
	if s.MaxConnsPerPeer <= 0 {
		s.MaxConnsPerPeer = 128
	}
	if s.ReadTimeout <= 0 {
		s.ReadTimeout = 10 * time.Second
	}
	if s.IdleTimeout <= 0 {
		s.IdleTimeout = 5 * time.Minute
	}
	if s.WriteTimeout <= 0 {
		s.WriteTimeout = 30 * time.Second
	}
	if s.MaxFrame <= 0 || s.MaxFrame > MaxFrame {
		s.MaxFrame = MaxFrame
	}
}

// MAC labels of the ctrl handshake.
const (
	macClient = "tilert-pd v2 client"
	macServer = "tilert-pd v2 server"
)

// Server is the decode node's ctrl port.
type Server struct {
	table     *Table
	transport Transport
	log       *slog.Logger
	sec       Security
	rate      *netguard.Rate

	mu     sync.Mutex
	lns    map[net.Listener]struct{}
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup
}

// NewServer serves table over ctrl connections, announcing transport in
// hello, with sec's authentication and limits.
func NewServer(table *Table, transport Transport, log *slog.Logger, sec Security) *Server {
	if log == nil {
		log = slog.Default()
	}
	sec.Defaults()
	return &Server{table: table, transport: transport, log: log, sec: sec, rate: netguard.NewRate(sec.AdmitsPerS, sec.AdmitsPerS),
		lns: map[net.Listener]struct{}{}, conns: map[net.Conn]struct{}{}}
}

// Hello is the full hello (what an authenticated connection gets).
func (s *Server) Hello() *Hello {
	cfg := s.table.Config()
	h := &Hello{Magic: Magic, ProtocolVersion: ProtocolVersion, Model: cfg.Layout.Model,
		LayoutVersion: cfg.Layout.LayoutVersion, KVCacheDType: cfg.Layout.KVCacheDType, NumLayers: cfg.Layout.NumLayers,
		MaxSeqLen: cfg.MaxSeqLen, Transport: s.transport, Slots: cfg.Slots, Busy: s.table.Busy(), Regions: cfg.Regions, Auth: AuthNone}
	if s.sec.Secret != nil {
		h.Auth = AuthHMAC
	}
	return h
}

// session is one ctrl connection as the table's owner: the write keys of
// its accepts are good only on transfer streams that name its id.
type session struct {
	net.Conn
	id string
}

func (s *session) PeerSession() string { return s.id }

// Serve accepts ctrl connections until ln is closed or Close is called.
func (s *Server) Serve(ln net.Listener) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return errors.New("pd: server closed")
	}
	s.lns[ln] = struct{}{}
	s.mu.Unlock()
	ln = netguard.Wrap(ln, netguard.Limits{MaxConns: s.sec.MaxConns, MaxPerPeer: s.sec.MaxConnsPerPeer, Name: "ctrl"})
	for {
		c, err := ln.Accept()
		if err != nil {
			s.mu.Lock()
			closed := s.closed
			delete(s.lns, ln)
			s.mu.Unlock()
			if closed {
				return nil
			}
			return errors.Wrap(err, "pd: accept")
		}
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			_ = c.Close()
			return nil
		}
		s.conns[c] = struct{}{}
		s.wg.Add(1)
		s.mu.Unlock()
		go s.serveConn(c)
	}
}

// Close stops listening, closes every connection (their reservations
// expire) and waits for the handlers.
func (s *Server) Close() error {
	s.mu.Lock()
	s.closed = true
	for ln := range s.lns {
		_ = ln.Close()
	}
	for c := range s.conns {
		_ = c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
	return nil
}

func (s *Server) serveConn(c net.Conn) {
	defer s.wg.Done()
	sess := &session{Conn: c}
	defer func() {
		s.table.Disconnect(sess)
		_ = c.Close()
		s.mu.Lock()
		delete(s.conns, c)
		s.mu.Unlock()
	}()
	peer := netguard.PeerKey(c.RemoteAddr())
	log := s.log.With("peer", c.RemoteAddr().String())
	br := bufio.NewReaderSize(c, 4096)
	send := func(m Message) error {
		_ = c.SetWriteDeadline(time.Now().Add(s.sec.WriteTimeout))
		return WriteMessage(c, m)
	}
	var ok bool
	if sess.id, ok = s.handshake(c, br, send, log); !ok {
		return
	}
	for {
		// Idle between frames up to IdleTimeout; a started frame must
		// arrive within ReadTimeout (slowloris).
		_ = c.SetReadDeadline(time.Now().Add(s.sec.IdleTimeout))
		if _, err := br.Peek(1); err != nil {
			if !isClosed(err) && !isTimeout(err) {
				log.Debug("pd: ctrl connection ended", "err", err.Error())
			}
			return
		}
		_ = c.SetReadDeadline(time.Now().Add(s.sec.ReadTimeout))
		m, err := ReadMessageLimit(br, s.sec.MaxFrame, "security.max_frame_bytes")
		if err != nil {
			if isClosed(err) {
				return
			}
			log.Warn("pd: closing ctrl connection after a bad frame", "err", err.Error())
			_ = send(&ErrorMsg{Error: "bad_frame", Message: err.Error()})
			return
		}
		var reply Message
		switch m := m.(type) {
		case *Admit:
			if ok, wait := s.rate.Allow(peer); !ok {
				reply = &Reject{RID: m.RID, Error: ReasonBusy, RetryAfterMS: max(1, wait.Milliseconds()),
					Message: fmt.Sprintf("admission rate limit security.admits_per_s (%g/s) for peer %s", s.sec.AdmitsPerS, peer)}
				log.Debug("pd: admit rate-limited", "rid", m.RID)
				break
			}
			acc, rej := s.table.Admit(m, sess)
			if rej != nil {
				log.Info("pd: admit rejected", "rid", rej.RID, "error", rej.Error, "message", rej.Message)
				reply = rej
			} else {
				log.Debug("pd: admit accepted", "rid", m.RID, "slot", acc.Slot, "generation", acc.Generation)
				reply = acc
			}
		case *Done:
			ack := s.table.Done(m)
			if !ack.OK {
				log.Warn("pd: done refused", "rid", m.RID, "slot", m.Slot, "generation", m.Generation, "error", ack.Error, "message", ack.Message)
			}
			reply = ack
		default:
			log.Warn("pd: closing ctrl connection after an unexpected message", "type", m.Type())
			_ = send(&ErrorMsg{Error: "unexpected_message", Message: "a ctrl server takes admit and done, not " + m.Type()})
			return
		}
		if err := send(reply); err != nil {
			log.Debug("pd: reply not sent", "err", err.Error())
			return
		}
	}
}

// handshake sends hello and, with a secret, checks the peer's proof of it
// before anything else is read; it returns the connection's session id.
func (s *Server) handshake(c net.Conn, br *bufio.Reader, send func(Message) error, log *slog.Logger) (string, bool) {
	id := auth.RandomID("s-")
	if s.sec.Secret == nil {
		h := s.Hello()
		h.Session = id
		if err := send(h); err != nil {
			log.Debug("pd: hello not sent", "err", err.Error())
			return "", false
		}
		return id, true
	}
	nonce := auth.Nonce()
	if err := send(&Hello{Magic: Magic, ProtocolVersion: ProtocolVersion, Auth: AuthHMAC, Nonce: nonce}); err != nil {
		return "", false
	}
	_ = c.SetReadDeadline(time.Now().Add(s.sec.ReadTimeout))
	m, err := ReadMessageLimit(br, PreAuthMaxFrame, "the pre-authentication frame limit")
	if err != nil {
		if !isClosed(err) {
			log.Warn("pd: ctrl handshake failed", "err", err.Error())
			_ = send(&ErrorMsg{Error: "unauthorized", Message: "the first frame must be auth: " + err.Error()})
		}
		return "", false
	}
	a, ok := m.(*AuthMsg)
	if !ok || !auth.Equal(a.MAC, auth.MAC(s.sec.Secret, macClient, nonce, a.Nonce)) {
		log.Warn("pd: ctrl peer failed authentication; closing", "type", m.Type())
		_ = send(&ErrorMsg{Error: "unauthorized", Message: "authenticate with the node's shared secret (security.secret_file) before anything else"})
		return "", false
	}
	h := s.Hello()
	h.Session = id
	h.MAC = auth.MAC(s.sec.Secret, macServer, nonce, a.Nonce, []byte(id))
	if err := send(h); err != nil {
		return "", false
	}
	return id, true
}

func isClosed(err error) bool {
	return err == io.EOF || errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed)
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
