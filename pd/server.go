package pd

import (
	"bufio"
	"io"
	"log/slog"
	"net"
	"sync"

	"github.com/cockroachdb/errors"
)

// Server is the decode node's ctrl port.
type Server struct {
	table     *Table
	transport Transport
	log       *slog.Logger

	mu     sync.Mutex
	lns    map[net.Listener]struct{}
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup
}

// NewServer serves table over ctrl connections, announcing transport in hello.
func NewServer(table *Table, transport Transport, log *slog.Logger) *Server {
	if log == nil {
		log = slog.Default()
	}
	return &Server{table: table, transport: transport, log: log, lns: map[net.Listener]struct{}{}, conns: map[net.Conn]struct{}{}}
}

// Hello is the frame a new connection gets.
func (s *Server) Hello() *Hello {
	cfg := s.table.Config()
	return &Hello{Magic: Magic, ProtocolVersion: ProtocolVersion, Model: cfg.Layout.Model,
		LayoutVersion: cfg.Layout.LayoutVersion, KVCacheDType: cfg.Layout.KVCacheDType, NumLayers: cfg.Layout.NumLayers,
		MaxSeqLen: cfg.MaxSeqLen, Transport: s.transport, Slots: cfg.Slots, Busy: s.table.Busy(), Regions: cfg.Regions}
}

// Serve accepts ctrl connections until ln is closed or Close is called.
func (s *Server) Serve(ln net.Listener) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return errors.New("pd: server closed")
	}
	s.lns[ln] = struct{}{}
	s.mu.Unlock()
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
	defer func() {
		s.table.Disconnect(c)
		_ = c.Close()
		s.mu.Lock()
		delete(s.conns, c)
		s.mu.Unlock()
	}()
	log := s.log.With("peer", c.RemoteAddr().String())
	if err := WriteMessage(c, s.Hello()); err != nil {
		log.Debug("pd: hello not sent", "err", err.Error())
		return
	}
	br := bufio.NewReader(c)
	for {
		m, err := ReadMessage(br)
		if err != nil {
			if err == io.EOF || errors.Is(err, net.ErrClosed) {
				return
			}
			log.Warn("pd: closing ctrl connection after a bad frame", "err", err.Error())
			_ = WriteMessage(c, &ErrorMsg{Error: "bad_frame", Message: err.Error()})
			return
		}
		var reply Message
		switch m := m.(type) {
		case *Admit:
			acc, rej := s.table.Admit(m, c)
			if rej != nil {
				log.Info("pd: admit rejected", "rid", m.RID, "error", rej.Error, "message", rej.Message)
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
			_ = WriteMessage(c, &ErrorMsg{Error: "unexpected_message", Message: "a ctrl server takes admit and done, not " + m.Type()})
			return
		}
		if err := WriteMessage(c, reply); err != nil {
			log.Debug("pd: reply not sent", "err", err.Error())
			return
		}
	}
}
