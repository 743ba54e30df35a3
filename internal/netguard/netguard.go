// Package netguard bounds what a listener's clients can hold: connections
// in total and per remote IP (a listener wrapper that closes the excess at
// once), and a per-peer token bucket for rates. Every TCP port of tilert and
// the sidecar's unix socket are served through it, so a flood of half-open
// connections cannot exhaust file descriptors or goroutines.
package netguard

import (
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Limits bound one listener. Zero means unlimited.
type Limits struct {
	// MaxConns is the connections held at once.
	MaxConns int
	// MaxPerPeer is the connections one remote IP holds at once (unix
	// sockets have no remote IP: only MaxConns applies).
	MaxPerPeer int
	// Name labels log lines ("ctrl", "transfer", "http", ...), and the
	// config keys named in them.
	Name string
	// OnRefuse is called for each refused connection with the limit's
	// name ("max_conns" or "max_conns_per_peer"); nil: nothing.
	OnRefuse func(limit string)
}

// Listener is a net.Listener that closes connections past its limits
// right after accepting them.
type Listener struct {
	net.Listener
	lim Limits

	mu      sync.Mutex
	total   int
	perPeer map[string]int

	refused   atomic.Int64
	lastLogNS atomic.Int64
}

// Wrap limits ln.
func Wrap(ln net.Listener, lim Limits) *Listener {
	return &Listener{Listener: ln, lim: lim, perPeer: map[string]int{}}
}

// PeerKey is the remote IP of addr ("" for addresses without one).
func PeerKey(addr net.Addr) string {
	switch a := addr.(type) {
	case *net.TCPAddr:
		return a.IP.String()
	case *net.UDPAddr:
		return a.IP.String()
	}
	if h, _, err := net.SplitHostPort(addr.String()); err == nil {
		return h
	}
	return ""
}

// Accept returns the next connection within the limits; the excess is
// closed without a byte read or written.
func (l *Listener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		peer := PeerKey(c.RemoteAddr())
		l.mu.Lock()
		refuse := ""
		switch {
		case l.lim.MaxConns > 0 && l.total >= l.lim.MaxConns:
			refuse = "max_conns"
		case l.lim.MaxPerPeer > 0 && peer != "" && l.perPeer[peer] >= l.lim.MaxPerPeer:
			refuse = "max_conns_per_peer"
		default:
			l.total++
			if peer != "" {
				l.perPeer[peer]++
			}
		}
		l.mu.Unlock()
		if refuse == "" {
			return &conn{Conn: c, l: l, peer: peer}, nil
		}
		// Counted before the close: whoever sees the connection closed
		// (the peer, a test, a scrape right after) sees it counted.
		l.refused.Add(1)
		if l.lim.OnRefuse != nil {
			l.lim.OnRefuse(refuse)
		}
		_ = c.Close()
		// One line a second at most: a flood must not become a log flood.
		now := time.Now().UnixNano()
		if last := l.lastLogNS.Load(); now-last > int64(time.Second) && l.lastLogNS.CompareAndSwap(last, now) {
			slog.Warn("netguard: connection refused at a limit", "listener", l.lim.Name, "limit", "security."+refuse,
				"peer", peer, "refused_total", l.refused.Load())
		}
	}
}

// Refused counts connections closed at a limit.
func (l *Listener) Refused() int64 { return l.refused.Load() }

// Open counts connections held now.
func (l *Listener) Open() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.total
}

func (l *Listener) release(peer string) {
	l.mu.Lock()
	l.total--
	if peer != "" {
		if l.perPeer[peer]--; l.perPeer[peer] <= 0 {
			delete(l.perPeer, peer)
		}
	}
	l.mu.Unlock()
}

type conn struct {
	net.Conn
	l    *Listener
	peer string
	once sync.Once
}

func (c *conn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { c.l.release(c.peer) })
	return err
}

// Unwrap returns the accepted connection (for TLS or tests).
func (c *conn) Unwrap() net.Conn { return c.Conn }

// Rate is a token bucket per peer: Allow(peer) takes one token; each peer
// refills at PerSecond up to Burst. Peers idle long enough to be full are
// forgotten, so the map is bounded by the peers active in the last
// Burst/PerSecond seconds.
type Rate struct {
	PerSecond float64
	Burst     float64

	mu      sync.Mutex
	buckets map[string]*bucket
	lastGC  time.Time
	now     func() time.Time
}

type bucket struct {
	tokens float64
	at     time.Time
}

// NewRate builds a limiter; perSecond <= 0 allows everything.
func NewRate(perSecond float64, burst float64) *Rate {
	if burst < 1 {
		burst = max(1, perSecond)
	}
	return &Rate{PerSecond: perSecond, Burst: burst, buckets: map[string]*bucket{}, now: time.Now}
}

// Allow takes a token for peer, or says how long until one is there.
func (r *Rate) Allow(peer string) (bool, time.Duration) {
	if r == nil || r.PerSecond <= 0 {
		return true, 0
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.now()
	full := time.Duration(r.Burst / r.PerSecond * float64(time.Second))
	if now.Sub(r.lastGC) > full {
		for k, b := range r.buckets {
			if now.Sub(b.at) >= full {
				delete(r.buckets, k)
			}
		}
		r.lastGC = now
	}
	b := r.buckets[peer]
	if b == nil {
		b = &bucket{tokens: r.Burst, at: now}
		r.buckets[peer] = b
	}
	b.tokens = min(r.Burst, b.tokens+now.Sub(b.at).Seconds()*r.PerSecond)
	b.at = now
	if b.tokens >= 1 {
		b.tokens--
		return true, 0
	}
	wait := time.Duration((1 - b.tokens) / r.PerSecond * float64(time.Second))
	return false, wait
}
