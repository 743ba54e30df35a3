package pd

import (
	"bufio"
	"context"
	"fmt"
	"hash/crc32"
	"net"
	"sync"
	"time"

	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/internal/auth"
	"github.com/tilert-go/tilert/rdma"
)

// RejectError is an admit the server refused.
type RejectError struct{ Reject *Reject }

func (e *RejectError) Error() string {
	return fmt.Sprintf("pd: admit %s rejected: %s: %s", e.Reject.RID, e.Reject.Error, e.Reject.Message)
}

// Retryable says whether the same admit may succeed later.
func (e *RejectError) Retryable() bool {
	return e.Reject.Error == ReasonBusy
}

// AckError is a done the server refused.
type AckError struct{ Ack *Ack }

func (e *AckError) Error() string {
	return fmt.Sprintf("pd: done %s (slot %d gen %d) refused: %s: %s", e.Ack.RID, e.Ack.Slot, e.Ack.Generation, e.Ack.Error, e.Ack.Message)
}

// ErrHello marks a server whose hello this client cannot work with.
var ErrHello = errors.New("pd: unusable hello")

// ErrAuth marks a failed authentication, either way round.
var ErrAuth = errors.New("pd: authentication failed")

// DialOption configures Dial.
type DialOption func(*dialOptions)

type dialOptions struct{ secret []byte }

// WithSecret makes Dial prove the shared secret to the node and check the
// node's proof; a node that does not ask is refused.
func WithSecret(secret []byte) DialOption { return func(o *dialOptions) { o.secret = secret } }

// Client is the sender's side of one ctrl connection (the connector sidecar,
// tests). One request at a time per Client; open several for concurrency.
type Client struct {
	mu    sync.Mutex
	conn  net.Conn
	br    *bufio.Reader
	hello *Hello
	peer  rdma.Peer
}

// Dial connects to a ctrl port, reads and checks hello (magic, protocol
// version, transport kind, and the layout when want is non-zero), runs the
// challenge-response when either side has a secret, and connects eng to the
// server's transfer endpoint under this connection's session.
func Dial(ctx context.Context, addr string, eng rdma.Engine, want Layout, opts ...DialOption) (*Client, error) {
	var o dialOptions
	for _, f := range opts {
		f(&o)
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, errors.Wrapf(err, "pd: dial ctrl port %s", addr)
	}
	c := &Client{conn: conn, br: bufio.NewReader(conn)}
	m, err := c.roundTrip(ctx, nil)
	if err != nil {
		_ = conn.Close()
		return nil, errors.Wrapf(err, "pd: hello from %s", addr)
	}
	h, ok := m.(*Hello)
	if !ok {
		_ = conn.Close()
		return nil, errors.Mark(errors.Newf("pd: %s sent %s before hello", addr, m.Type()), ErrHello)
	}
	if h, err = c.authenticate(ctx, h, o.secret); err != nil {
		_ = conn.Close()
		return nil, errors.Wrapf(err, "pd: %s", addr)
	}
	if err := checkHello(h, eng, want); err != nil {
		_ = conn.Close()
		return nil, errors.Wrapf(err, "pd: %s", addr)
	}
	c.hello = h
	if sc, ok := eng.(rdma.SessionConnector); ok {
		c.peer, err = sc.ConnectAs(ctx, h.Transport.Endpoint, h.Session)
	} else {
		c.peer, err = eng.Connect(ctx, h.Transport.Endpoint)
	}
	if err != nil {
		_ = conn.Close()
		return nil, errors.Wrapf(err, "pd: transfer engine of %s", addr)
	}
	return c, nil
}

// authenticate answers a challenge hello and returns the full hello, whose
// MAC proves the node holds the secret as well.
func (c *Client) authenticate(ctx context.Context, h *Hello, secret []byte) (*Hello, error) {
	if h.Magic != Magic || h.ProtocolVersion != ProtocolVersion {
		return h, nil // checkHello says what is wrong
	}
	if !h.Challenge() {
		if secret != nil {
			return nil, errors.WithHint(errors.Mark(errors.New("the decode node does not authenticate its ctrl port, but this side has a secret"), ErrAuth),
				"set the same security.secret_file on the decode node (or remove it here)")
		}
		return h, nil
	}
	if secret == nil {
		return nil, errors.WithHint(errors.Mark(errors.New("the decode node wants authentication and this side has no secret"), ErrAuth),
			"set security.secret_file (or TILERT_SECURITY_SECRET_FILE) to the node's shared secret")
	}
	cn := auth.Nonce()
	m, err := c.roundTrip(ctx, &AuthMsg{Nonce: cn, MAC: auth.MAC(secret, macClient, h.Nonce, cn)})
	if err != nil {
		return nil, errors.WithHint(errors.Mark(errors.Wrap(err, "authenticating"), ErrAuth),
			"the node refused this side's proof: both need the same security.secret_file")
	}
	full, ok := m.(*Hello)
	if !ok || full.Challenge() || !auth.Equal(full.MAC, auth.MAC(secret, macServer, h.Nonce, cn, []byte(full.Session))) {
		return nil, errors.WithHint(errors.Mark(errors.New("the node's reply does not prove the shared secret"), ErrAuth),
			"check that this address is your decode node and that both sides have the same security.secret_file")
	}
	return full, nil
}

func checkHello(h *Hello, eng rdma.Engine, want Layout) error {
	switch {
	case h.Magic != Magic:
		return errors.Mark(errors.Newf("magic %q, want %q: not a TileRT ctrl port", h.Magic, Magic), ErrHello)
	case h.ProtocolVersion != ProtocolVersion:
		return errors.Mark(errors.Newf("protocol version %d, this client speaks %d", h.ProtocolVersion, ProtocolVersion), ErrHello)
	case h.Transport.Kind != eng.Kind():
		return errors.WithHint(errors.Mark(errors.Newf("decode node uses transfer engine %q, this side %q", h.Transport.Kind, eng.Kind()), ErrHello),
			"configure the same transfer engine on the prefill and decode nodes")
	case want != (Layout{}) && want != h.Layout():
		return errors.Mark(errors.Newf("layout %+v, this side has %+v", h.Layout(), want), ErrHello)
	}
	return nil
}

// Hello returns the server's hello.
func (c *Client) Hello() *Hello { return c.hello }

// Close closes the ctrl connection and the transfer peer.
func (c *Client) Close() error {
	err := c.conn.Close()
	if c.peer != nil {
		_ = c.peer.Close()
	}
	return err
}

// roundTrip sends m (when non-nil) and reads one reply within ctx.
func (c *Client) roundTrip(ctx context.Context, m Message) (Message, error) {
	dl, ok := ctx.Deadline()
	if !ok {
		dl = time.Time{}
	}
	_ = c.conn.SetDeadline(dl)
	stop := context.AfterFunc(ctx, func() { _ = c.conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	if m != nil {
		if err := WriteMessage(c.conn, m); err != nil {
			return nil, err
		}
	}
	r, err := ReadMessage(c.br)
	if err != nil {
		if ctx.Err() != nil {
			return nil, errors.Wrap(ctx.Err(), "pd: waiting for the ctrl reply")
		}
		return nil, err
	}
	if e, ok := r.(*ErrorMsg); ok {
		return nil, errors.Newf("pd: server closed the connection: %s: %s", e.Error, e.Message)
	}
	return r, nil
}

// Admit asks for a slot. Magic, version and layout fields left empty are
// filled from hello. A refusal is a *RejectError.
func (c *Client) Admit(ctx context.Context, a *Admit) (*Accept, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if a.Magic == "" {
		a.Magic = Magic
	}
	if a.ProtocolVersion == 0 {
		a.ProtocolVersion = ProtocolVersion
	}
	if a.Model == "" && a.LayoutVersion == 0 && a.KVCacheDType == "" && a.NumLayers == 0 {
		l := c.hello.Layout()
		a.Model, a.LayoutVersion, a.KVCacheDType, a.NumLayers = l.Model, l.LayoutVersion, l.KVCacheDType, l.NumLayers
	}
	m, err := c.roundTrip(ctx, a)
	if err != nil {
		return nil, err
	}
	switch m := m.(type) {
	case *Accept:
		if m.RID != a.RID || len(m.Regions) != len(a.Regions) {
			return nil, errors.Newf("pd: accept for %s with %d regions answers admit %s with %d", m.RID, len(m.Regions), a.RID, len(a.Regions))
		}
		for i, d := range m.Regions {
			if d.Name != a.Regions[i].Name || d.Bytes != a.Regions[i].Bytes {
				return nil, errors.Newf("pd: accept region %d is %q/%d bytes, admitted %q/%d", i, d.Name, d.Bytes, a.Regions[i].Name, a.Regions[i].Bytes)
			}
		}
		return m, nil
	case *Reject:
		return nil, &RejectError{Reject: m}
	}
	return nil, errors.Newf("pd: admit answered with %s", m.Type())
}

// Source is where one region's bytes come from on the sending side: Bytes
// bytes (the admitted size) at Offset in the registered local region.
// Host is a view of exactly those bytes, for the checksum.
type Source struct {
	Name   string
	Region rdma.RegionID
	Offset int64
	Host   []byte
}

// Write sends the sources into the accepted slot through the transfer
// engine and returns the byte count and CRC-32C for done. Sources must be
// in admit order.
func (c *Client) Write(ctx context.Context, acc *Accept, srcs []Source) (int64, uint32, error) {
	if len(srcs) != len(acc.Regions) {
		return 0, 0, errors.Newf("pd: %d sources for %d accepted regions", len(srcs), len(acc.Regions))
	}
	ops := make([]rdma.WriteOp, 0, len(srcs))
	var total int64
	var crc uint32
	for i, s := range srcs {
		d := acc.Regions[i]
		if s.Name != d.Name || int64(len(s.Host)) != d.Bytes {
			return 0, 0, errors.Newf("pd: source %d is %q with %d bytes, destination %q takes %d", i, s.Name, len(s.Host), d.Name, d.Bytes)
		}
		if d.Bytes > 0 {
			ops = append(ops, rdma.WriteOp{Local: s.Region, LocalOff: s.Offset, Remote: d.Remote, RemoteOff: d.Offset, Len: d.Bytes})
		}
		crc = crc32.Update(crc, Castagnoli, s.Host)
		total += d.Bytes
	}
	if err := c.peer.Write(ctx, ops); err != nil {
		return 0, 0, errors.Wrapf(err, "pd: write %s into slot %d gen %d", acc.RID, acc.Slot, acc.Generation)
	}
	return total, crc, nil
}

// Done reports the completed writes and waits for the ack. A refusal is an
// *AckError.
func (c *Client) Done(ctx context.Context, acc *Accept, bytes int64, checksum uint32) (*Ack, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	m, err := c.roundTrip(ctx, &Done{RID: acc.RID, Slot: acc.Slot, Generation: acc.Generation, Bytes: bytes, Checksum: checksum})
	if err != nil {
		return nil, err
	}
	ack, ok := m.(*Ack)
	if !ok {
		return nil, errors.Newf("pd: done answered with %s", m.Type())
	}
	if !ack.OK {
		return ack, &AckError{Ack: ack}
	}
	return ack, nil
}

// Send is admit, write, done.
func (c *Client) Send(ctx context.Context, a *Admit, srcs []Source) (*Ack, error) {
	acc, err := c.Admit(ctx, a)
	if err != nil {
		return nil, err
	}
	n, crc, err := c.Write(ctx, acc, srcs)
	if err != nil {
		return nil, err
	}
	return c.Done(ctx, acc, n, crc)
}
