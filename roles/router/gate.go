package router

import (
	"context"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/cockroachdb/errors"
)

// node is one decode node of the pool.
type node struct {
	spec     string // host:ctrl_port:http_port as given
	host     string // where vLLM's connector reaches the ctrl port
	ctrlPort int
	httpURL  string // base URL of the node's http port

	// Guarded by gate.mu.
	slots    int // max_inflight from /capabilities
	maxSeq   int
	eos      []int
	inflight int
	up       bool
	// Health bookkeeping (guarded by gate.mu): a down node is probed again
	// at nextProbe, backing off while it stays down.
	backoff   time.Duration
	nextProbe time.Time
	lastErr   string
}

// parseNode reads host:ctrl_port:http_port (IPv6 hosts in brackets).
func parseNode(s string) (*node, error) {
	bad := func(why string) error {
		return errors.WithHint(errors.Newf("--decode %q: %s", s, why), "write decode nodes as host:ctrl_port:http_port, e.g. decode-node:5556:5557")
	}
	i := strings.LastIndexByte(s, ':')
	if i < 0 {
		return nil, bad("no ports")
	}
	j := strings.LastIndexByte(s[:i], ':')
	if j < 0 {
		return nil, bad("one port; both the ctrl and the http port are needed")
	}
	host := strings.TrimSuffix(strings.TrimPrefix(s[:j], "["), "]")
	if host == "" {
		return nil, bad("empty host")
	}
	ctrl, err1 := strconv.Atoi(s[j+1 : i])
	httpPort, err2 := strconv.Atoi(s[i+1:])
	if err1 != nil || err2 != nil || ctrl <= 0 || ctrl > 65535 || httpPort <= 0 || httpPort > 65535 {
		return nil, bad("ports must be numbers in 1..65535")
	}
	return &node{spec: s, host: host, ctrlPort: ctrl, slots: 1,
		httpURL: "http://" + net.JoinHostPort(host, strconv.Itoa(httpPort))}, nil
}

// The gate's refusals: errQueueFull and errQueueTimeout are 429s,
// errNoNodes a 503 (every decode node is down).
var (
	errQueueFull    = errors.New("queue full")
	errQueueTimeout = errors.New("queue timeout")
	errNoNodes      = errors.New("no decode node is up")
)

// gate admits requests to decode nodes that are up: each node takes up to
// its own slot count; past that, requests wait in one FIFO queue of bounded
// length for at most a deadline. A freed slot goes straight to the oldest
// waiter, so the queue is fair and a slot is never idle while someone
// waits. A waiter is told errNoNodes when the last node goes down.
type gate struct {
	mu      sync.Mutex
	nodes   []*node
	waiters []chan *node // nil sent: no node is up any more
	maxWait int
}

func newGate(nodes []*node, queueSize int) *gate {
	return &gate{nodes: nodes, maxWait: queueSize}
}

// pickLocked returns the up node with the most free slots, or nil.
func (g *gate) pickLocked() *node {
	var best *node
	for _, n := range g.nodes {
		if !n.up {
			continue
		}
		if free := n.slots - n.inflight; free > 0 && (best == nil || free > best.slots-best.inflight) {
			best = n
		}
	}
	return best
}

func (g *gate) anyUpLocked() bool {
	for _, n := range g.nodes {
		if n.up {
			return true
		}
	}
	return false
}

// acquire takes a slot on some up node, waiting in the queue up to timeout.
// Errors: errNoNodes, errQueueFull, errQueueTimeout, or ctx's error.
func (g *gate) acquire(ctx context.Context, timeout time.Duration) (*node, error) {
	g.mu.Lock()
	if !g.anyUpLocked() {
		g.mu.Unlock()
		return nil, errNoNodes
	}
	if n := g.pickLocked(); n != nil && len(g.waiters) == 0 {
		n.inflight++
		g.mu.Unlock()
		return n, nil
	}
	if len(g.waiters) >= g.maxWait {
		g.mu.Unlock()
		return nil, errQueueFull
	}
	ch := make(chan *node, 1)
	g.waiters = append(g.waiters, ch)
	g.mu.Unlock()

	t := time.NewTimer(timeout)
	defer t.Stop()
	var err error
	select {
	case n := <-ch:
		if n == nil {
			return nil, errNoNodes
		}
		return n, nil
	case <-t.C:
		err = errQueueTimeout
	case <-ctx.Done():
		err = ctx.Err()
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	for i, w := range g.waiters {
		if w == ch {
			g.waiters = append(g.waiters[:i], g.waiters[i+1:]...)
			return nil, err
		}
	}
	// A slot was handed over between the deadline and the lock: pass it on.
	if n := <-ch; n != nil {
		g.releaseLocked(n)
	}
	return nil, err
}

func (g *gate) release(n *node) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.releaseLocked(n)
}

func (g *gate) releaseLocked(n *node) {
	if n.up && len(g.waiters) > 0 {
		w := g.waiters[0]
		g.waiters = g.waiters[1:]
		w <- n // the slot moves to the waiter; n.inflight is unchanged
		return
	}
	n.inflight--
}

// setUp marks n up or down. Up: its free slots go to waiting requests.
// Down: new requests skip it, and if no node is up, waiters are told so.
// It reports whether the state changed.
func (g *gate) setUp(n *node, up bool, why string) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	changed := n.up != up
	n.up, n.lastErr = up, why
	if up {
		n.backoff = 0
		for len(g.waiters) > 0 && n.inflight < n.slots {
			w := g.waiters[0]
			g.waiters = g.waiters[1:]
			n.inflight++
			w <- n
		}
	} else if !g.anyUpLocked() {
		for _, w := range g.waiters {
			w <- nil
		}
		g.waiters = nil
	}
	return changed
}

// queued is the number of requests waiting for a slot.
func (g *gate) queued() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.waiters)
}

// busy is the number of slots in use over the up nodes, and their total.
func (g *gate) busy() (inUse, total int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, n := range g.nodes {
		if n.up {
			inUse += n.inflight
			total += n.slots
		}
	}
	return inUse, total
}

// upCount is the number of nodes up.
func (g *gate) upCount() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	k := 0
	for _, n := range g.nodes {
		if n.up {
			k++
		}
	}
	return k
}

// maxSeqLen is the smallest max_seq_len of the nodes (what /v1/models
// reports), 0 when unknown.
func (g *gate) maxSeqLen() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	m := 0
	for _, n := range g.nodes {
		if n.maxSeq > 0 && (m == 0 || n.maxSeq < m) {
			m = n.maxSeq
		}
	}
	return m
}
