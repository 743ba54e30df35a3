package pd

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/cockroachdb/errors"
)

// Receiver opens and closes a slot's receive regions in the transfer engine.
// The table calls Open only after it has reserved the slot for one
// rid+generation, and Close before it reads or hands out the slot, so no
// write can land outside [accept, done].
type Receiver interface {
	// Open makes the slot's regions writable for writes carrying gen and
	// returns one destination per admitted region, in the same order. peer
	// is the authenticated ctrl session that asked ("" when unknown): a
	// receiver that can, accepts the writes only from that session's streams.
	Open(slot int, gen uint64, peer string, sizes []RegionSize) ([]Destination, error)
	// Close revokes every region of the slot. After it returns no write lands
	// there and the memory holds every completed write.
	Close(slot int) error
	// Checksum is CRC-32C over the destinations' bytes in order.
	Checksum(slot int, dests []Destination) (uint32, error)
}

// Clock schedules the table's deadlines; tests replace it.
type Clock interface {
	AfterFunc(d time.Duration, f func()) Timer
}

// Timer is a scheduled deadline.
type Timer interface{ Stop() bool }

type realClock struct{}

func (realClock) AfterFunc(d time.Duration, f func()) Timer { return time.AfterFunc(d, f) }

// TableConfig describes the decode node's slots.
type TableConfig struct {
	Slots     int
	Layout    Layout
	MaxSeqLen int
	// Regions is each slot's receive regions and their capacities.
	Regions []RegionCap
	// CheckSizes, when set, validates an admit's region sizes for its
	// seq_len exactly (the engine knows its bytes per token); an error is
	// reported as layout_mismatch.
	CheckSizes func(seqLen int, sizes []RegionSize) error
	// MTP says the engine drafts with the MTP layer: it can recompute only
	// the last MTP position, so admits need mtp_len >= seq_len-1.
	MTP bool
	// Deadline is how long a reserved slot waits for done (default 30 s).
	Deadline time.Duration
	// ReadyTTL is how long arrived state waits for /pd/decode (default 60 s).
	ReadyTTL time.Duration
	// CancelTTL is how long a cancelled rid stays refused (default 60 s).
	CancelTTL time.Duration
	// RetryAfter is the hint in busy rejects (default 100 ms).
	RetryAfter time.Duration
	// MaxRIDBytes bounds admitted rids (security.max_rid_bytes, default 128).
	MaxRIDBytes int
	// MaxCancelled bounds the cancelled rids remembered
	// (security.cancelled_rids, default 65536); past it the oldest go.
	MaxCancelled int
	Clock        Clock
}

// SlotState is where a slot is in its cycle.
type SlotState int

const (
	SlotFree      SlotState = iota
	SlotReserved            // accepted; writes allowed; waiting for done
	SlotVerifying           // done received; regions closing, checksum running
	SlotReady               // state in place, waiting for WaitReady
	SlotInUse               // handed to the engine; Release frees it
)

func (s SlotState) String() string {
	return [...]string{"free", "reserved", "verifying", "ready", "in_use"}[s]
}

// Ready is a slot whose state has arrived, handed out by WaitReady.
type Ready struct {
	RID             string
	Slot            int
	Generation      uint64
	SeqLen          int
	MTPLen          int // admit's mtp_len, SeqLen when omitted
	LastPromptToken int
	PromptTokenIDs  []int
	Regions         []Destination
}

type slot struct {
	state SlotState
	gen   uint64
	admit *Admit
	dests []Destination
	owner any
	timer Timer
}

type waiter struct {
	ch chan struct{} // closed (and replaced) when the rid's state changes; guarded by Table.mu
}

// Table is the decode node's slot manager: transport- and engine-agnostic.
type Table struct {
	cfg  TableConfig
	recv Receiver

	mu        sync.Mutex
	slots     []slot
	byRID     map[string]int // rid -> slot, for reserved..in_use
	waiters   map[string]*waiter
	cancelled map[string]time.Time
	cancelQ   cancelQueue // the cancelled rids in cancel order, one entry each
	now       func() time.Time
}

// cancelQueue is a FIFO of cancelled rids: entries are appended in time
// order, so expiry and eviction pop from the front in O(1) (amortised).
type cancelQueue struct {
	items []cancelEntry
	head  int
}

type cancelEntry struct {
	rid string
	at  time.Time
}

func (q *cancelQueue) push(e cancelEntry) { q.items = append(q.items, e) }
func (q *cancelQueue) len() int           { return len(q.items) - q.head }
func (q *cancelQueue) front() cancelEntry { return q.items[q.head] }
func (q *cancelQueue) pop() {
	q.items[q.head] = cancelEntry{}
	q.head++
	if q.head > 1024 && q.head > len(q.items)/2 {
		q.items = append(q.items[:0:0], q.items[q.head:]...)
		q.head = 0
	}
}

// Errors from WaitReady.
var (
	ErrTimeout    = errors.New("pd: request state did not arrive in time")
	ErrCancelled  = errors.New("pd: request cancelled")
	ErrDuplicate  = errors.New("pd: request already waited for")
	ErrNotInUse   = errors.New("pd: slot is not in use by that generation")
	ErrBadConfig  = errors.New("pd: bad table config")
	errNoSuchSlot = errors.New("pd: no such slot")
)

// NewTable builds a table; every slot starts free with generation 0.
func NewTable(cfg TableConfig, recv Receiver) (*Table, error) {
	if cfg.Slots <= 0 || len(cfg.Regions) == 0 || cfg.MaxSeqLen <= 0 || recv == nil {
		return nil, errors.Mark(errors.Newf("pd: table needs slots (%d), regions (%d), max_seq_len (%d) and a receiver",
			cfg.Slots, len(cfg.Regions), cfg.MaxSeqLen), ErrBadConfig)
	}
	if cfg.Deadline <= 0 {
		cfg.Deadline = 30 * time.Second
	}
	if cfg.ReadyTTL <= 0 {
		cfg.ReadyTTL = 60 * time.Second
	}
	if cfg.CancelTTL <= 0 {
		cfg.CancelTTL = 60 * time.Second
	}
	if cfg.RetryAfter <= 0 {
		cfg.RetryAfter = 100 * time.Millisecond
	}
	if cfg.MaxRIDBytes <= 0 {
		cfg.MaxRIDBytes = 128
	}
	if cfg.MaxCancelled <= 0 {
		cfg.MaxCancelled = 65536
	}
	if cfg.Clock == nil {
		cfg.Clock = realClock{}
	}
	return &Table{cfg: cfg, recv: recv, slots: make([]slot, cfg.Slots), byRID: map[string]int{},
		waiters: map[string]*waiter{}, cancelled: map[string]time.Time{}, now: time.Now}, nil
}

// Config returns the table's configuration (with defaults filled in).
func (t *Table) Config() TableConfig { return t.cfg }

// Busy counts slots that are not free.
func (t *Table) Busy() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := 0
	for i := range t.slots {
		if t.slots[i].state != SlotFree {
			n++
		}
	}
	return n
}

// SlotInfo is one slot's state for status pages.
type SlotInfo struct {
	Slot       int    `json:"slot"`
	State      string `json:"state"`
	Generation uint64 `json:"generation"`
	RID        string `json:"rid,omitempty"`
}

// Snapshot lists every slot's state.
func (t *Table) Snapshot() []SlotInfo {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]SlotInfo, len(t.slots))
	for i, s := range t.slots {
		out[i] = SlotInfo{Slot: i, State: s.state.String(), Generation: s.gen}
		if s.admit != nil {
			out[i].RID = s.admit.RID
		}
	}
	return out
}

func (t *Table) reject(a *Admit, reason, format string, args ...any) *Reject {
	r := &Reject{RID: a.RID, Error: reason, Message: fmt.Sprintf(format, args...)}
	if reason == ReasonBusy || reason == ReasonCancelling {
		r.RetryAfterMS = t.cfg.RetryAfter.Milliseconds()
	}
	return r
}

func (t *Table) check(a *Admit) *Reject {
	if err := CheckRID(a.RID, t.cfg.MaxRIDBytes, "security.max_rid_bytes"); err != nil {
		r := t.reject(a, ReasonBadRequest, "%v", err)
		r.RID = ""
		return r
	}
	if a.Magic != Magic {
		return t.reject(a, ReasonBadRequest, "magic %q is not %q", a.Magic, Magic)
	}
	if a.ProtocolVersion != ProtocolVersion {
		return t.reject(a, ReasonLayoutMismatch, "protocol version %d, this node speaks %d", a.ProtocolVersion, ProtocolVersion)
	}
	if got, want := a.Layout(), t.cfg.Layout; got != want {
		return t.reject(a, ReasonLayoutMismatch, "layout %+v, this node has %+v", got, want)
	}
	if a.SeqLen > t.cfg.MaxSeqLen {
		return t.reject(a, ReasonTooLong, "seq_len %d exceeds max_seq_len %d", a.SeqLen, t.cfg.MaxSeqLen)
	}
	if t.cfg.MTP && a.MTPLength() < a.SeqLen-1 {
		return t.reject(a, ReasonBadRequest, "mtp_len %d with seq_len %d: this node drafts with the MTP layer and can recompute only its last position, so the MTP cache must hold at least seq_len-1 positions", a.MTPLength(), a.SeqLen)
	}
	if len(a.Regions) != len(t.cfg.Regions) {
		return t.reject(a, ReasonLayoutMismatch, "%d regions, this node has %d", len(a.Regions), len(t.cfg.Regions))
	}
	for _, r := range a.Regions {
		capacity := int64(-1)
		for _, c := range t.cfg.Regions {
			if c.Name == r.Name {
				capacity = c.Capacity
			}
		}
		if capacity < 0 {
			return t.reject(a, ReasonLayoutMismatch, "unknown region %q", r.Name)
		}
		if r.Bytes > capacity {
			return t.reject(a, ReasonTooLong, "region %q: %d bytes exceed the slot's %d", r.Name, r.Bytes, capacity)
		}
	}
	if t.cfg.CheckSizes != nil {
		if err := t.cfg.CheckSizes(a.SeqLen, a.Regions); err != nil {
			return t.reject(a, ReasonLayoutMismatch, "%v", err)
		}
	}
	return nil
}

// PeerOwner is an owner that knows its authenticated ctrl session.
type PeerOwner interface{ PeerSession() string }

// Admit reserves a free slot for a and opens its regions to a's writes, or
// says why not. owner identifies the ctrl connection (see Disconnect); when
// it is a PeerOwner the regions open for its session only.
func (t *Table) Admit(a *Admit, owner any) (*Accept, *Reject) {
	if rej := t.check(a); rej != nil {
		return nil, rej
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.gcCancelled()
	if _, ok := t.cancelled[a.RID]; ok {
		return nil, t.reject(a, ReasonCancelling, "request %s was cancelled", a.RID)
	}
	if _, ok := t.byRID[a.RID]; ok {
		return nil, t.reject(a, ReasonBadRequest, "request %s already holds a slot", a.RID)
	}
	idx := -1
	for i := range t.slots {
		if t.slots[i].state == SlotFree {
			idx = i
			break
		}
	}
	if idx < 0 {
		return nil, t.reject(a, ReasonBusy, "all %d slots busy", len(t.slots))
	}
	s := &t.slots[idx]
	s.gen++
	peer := ""
	if po, ok := owner.(PeerOwner); ok {
		peer = po.PeerSession()
	}
	dests, err := t.recv.Open(idx, s.gen, peer, a.Regions)
	if err != nil {
		_ = t.recv.Close(idx)
		return nil, t.reject(a, ReasonBusy, "opening slot %d: %v", idx, err)
	}
	s.state, s.admit, s.dests, s.owner = SlotReserved, a, dests, owner
	gen := s.gen
	s.timer = t.cfg.Clock.AfterFunc(t.cfg.Deadline, func() { t.expire(idx, gen, SlotReserved, "deadline") })
	t.byRID[a.RID] = idx
	return &Accept{RID: a.RID, Slot: idx, Generation: gen, DeadlineMS: t.cfg.Deadline.Milliseconds(), Regions: dests}, nil
}

// expire frees slot idx if it is still in state want at generation gen.
// Its generation is bumped so nothing written under the old one is usable.
func (t *Table) expire(idx int, gen uint64, want SlotState, why string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := &t.slots[idx]
	if s.gen != gen || s.state != want {
		return false
	}
	if want == SlotReserved {
		_ = t.recv.Close(idx)
	}
	// A waiter for this rid keeps waiting: the sender may retry the admit.
	t.freeLocked(idx)
	s.gen++
	return true
}

func (t *Table) freeLocked(idx int) {
	s := &t.slots[idx]
	if s.timer != nil {
		s.timer.Stop()
	}
	if s.admit != nil && t.byRID[s.admit.RID] == idx {
		delete(t.byRID, s.admit.RID)
	}
	s.state, s.admit, s.dests, s.owner, s.timer = SlotFree, nil, nil, nil, nil
}

// Disconnect expires every slot still reserved by owner: a sender whose
// ctrl connection dropped cannot send done any more.
func (t *Table) Disconnect(owner any) {
	t.mu.Lock()
	var gone [][2]uint64
	for i := range t.slots {
		if t.slots[i].state == SlotReserved && t.slots[i].owner == owner {
			gone = append(gone, [2]uint64{uint64(i), t.slots[i].gen})
		}
	}
	t.mu.Unlock()
	for _, g := range gone {
		t.expire(int(g[0]), g[1], SlotReserved, "sender disconnected")
	}
}

func (t *Table) ack(d *Done, errCode, format string, args ...any) *Ack {
	return &Ack{RID: d.RID, Slot: d.Slot, Generation: d.Generation, Error: errCode, Message: fmt.Sprintf(format, args...)}
}

// Done closes the slot's regions to writes, checks size and checksum and
// makes the state ready for WaitReady. A done for anything but the current
// reserved generation of that slot and rid is refused as stale.
func (t *Table) Done(d *Done) *Ack {
	t.mu.Lock()
	if d.Slot < 0 || d.Slot >= len(t.slots) {
		t.mu.Unlock()
		return t.ack(d, AckStale, "no slot %d", d.Slot)
	}
	s := &t.slots[d.Slot]
	if s.state != SlotReserved || s.gen != d.Generation || s.admit.RID != d.RID {
		msg := fmt.Sprintf("slot %d is %s at generation %d", d.Slot, s.state, s.gen)
		t.mu.Unlock()
		return t.ack(d, AckStale, "%s", msg)
	}
	s.state = SlotVerifying
	s.timer.Stop()
	want := s.admit.TotalBytes()
	dests := s.dests
	t.mu.Unlock()

	// Outside the lock: Close may wait for a chunk in flight.
	fail := func(code, format string, args ...any) *Ack {
		t.expire(d.Slot, d.Generation, SlotVerifying, code)
		return t.ack(d, code, format, args...)
	}
	if err := t.recv.Close(d.Slot); err != nil {
		return fail(AckStale, "closing slot %d: %v", d.Slot, err)
	}
	if d.Bytes != want {
		return fail(AckSizeMismatch, "done says %d bytes, admit said %d", d.Bytes, want)
	}
	sum, err := t.recv.Checksum(d.Slot, dests)
	if err != nil {
		return fail(AckChecksumMismatch, "checksum of slot %d: %v", d.Slot, err)
	}
	if sum != d.Checksum {
		return fail(AckChecksumMismatch, "crc32c of the landed bytes is %08x, done says %08x", sum, d.Checksum)
	}

	t.mu.Lock()
	defer t.mu.Unlock()
	if s.state != SlotVerifying || s.gen != d.Generation {
		return t.ack(d, AckStale, "slot %d changed during verification", d.Slot)
	}
	if _, ok := t.cancelled[d.RID]; ok {
		t.freeLocked(d.Slot)
		s.gen++
		return t.ack(d, AckStale, "request %s was cancelled", d.RID)
	}
	s.state = SlotReady
	gen := s.gen
	s.timer = t.cfg.Clock.AfterFunc(t.cfg.ReadyTTL, func() { t.expire(d.Slot, gen, SlotReady, "not claimed") })
	t.wakeLocked(d.RID)
	return &Ack{RID: d.RID, Slot: d.Slot, Generation: gen, OK: true}
}

// WaitReady waits until rid's state has arrived (the admit may come after
// this call) and hands the slot to the caller, who must Release it.
func (t *Table) WaitReady(ctx context.Context, rid string) (*Ready, error) {
	t.mu.Lock()
	if _, ok := t.waiters[rid]; ok {
		t.mu.Unlock()
		return nil, errors.Mark(errors.Newf("pd: request %s already has a waiter", rid), ErrDuplicate)
	}
	w := &waiter{ch: make(chan struct{})}
	t.waiters[rid] = w
	for {
		if r, err := t.claimLocked(rid); r != nil || err != nil {
			delete(t.waiters, rid)
			t.mu.Unlock()
			return r, err
		}
		ch := w.ch
		t.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			t.mu.Lock()
			r, err := t.claimLocked(rid) // it may have arrived at the same time
			delete(t.waiters, rid)
			t.mu.Unlock()
			if r != nil || err != nil {
				return r, err
			}
			return nil, errors.Mark(errors.Wrapf(ctx.Err(), "pd: waiting for request %s", rid), ErrTimeout)
		}
		t.mu.Lock()
	}
}

// wakeLocked tells rid's waiter to look again.
func (t *Table) wakeLocked(rid string) {
	if w := t.waiters[rid]; w != nil {
		close(w.ch)
		w.ch = make(chan struct{})
	}
}

func (t *Table) claimLocked(rid string) (*Ready, error) {
	if _, ok := t.cancelled[rid]; ok {
		return nil, errors.Mark(errors.Newf("pd: request %s cancelled", rid), ErrCancelled)
	}
	idx, ok := t.byRID[rid]
	if !ok || t.slots[idx].state != SlotReady {
		return nil, nil
	}
	s := &t.slots[idx]
	s.timer.Stop()
	s.timer = nil
	s.state = SlotInUse
	a := s.admit
	return &Ready{RID: rid, Slot: idx, Generation: s.gen, SeqLen: a.SeqLen, MTPLen: a.MTPLength(),
		LastPromptToken: a.LastPromptToken, PromptTokenIDs: a.PromptTokenIDs, Regions: s.dests}, nil
}

// Release frees a slot handed out by WaitReady (decode finished or cancelled).
func (t *Table) Release(slotIdx int, gen uint64) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if slotIdx < 0 || slotIdx >= len(t.slots) {
		return errNoSuchSlot
	}
	s := &t.slots[slotIdx]
	if s.state != SlotInUse || s.gen != gen {
		return errors.Mark(errors.Newf("pd: release slot %d gen %d: it is %s at gen %d", slotIdx, gen, s.state, s.gen), ErrNotInUse)
	}
	t.freeLocked(slotIdx)
	return nil
}

// Cancel drops rid wherever it is before decoding: a reserved slot expires,
// ready state is freed, a waiter returns ErrCancelled, and admits for rid
// are refused with "cancelling" for CancelTTL. It reports whether rid is in
// use by the engine (then the engine stops it and calls Release).
func (t *Table) Cancel(rid string) (inUse bool) {
	t.mu.Lock()
	t.gcCancelled()
	if _, ok := t.cancelled[rid]; !ok {
		// Bounded: past MaxCancelled the oldest cancellation is forgotten
		// (its admits would be taken again, which a rid nobody reuses
		// never tries). A repeated cancel keeps the first time.
		for t.cancelQ.len() >= t.cfg.MaxCancelled {
			delete(t.cancelled, t.cancelQ.front().rid)
			t.cancelQ.pop()
		}
		at := t.now()
		t.cancelled[rid] = at
		t.cancelQ.push(cancelEntry{rid: rid, at: at})
	}
	t.wakeLocked(rid)
	idx, ok := t.byRID[rid]
	if !ok {
		t.mu.Unlock()
		return false
	}
	s := &t.slots[idx]
	state, gen := s.state, s.gen
	t.mu.Unlock()
	switch state {
	case SlotReserved, SlotReady:
		t.expire(idx, gen, state, "cancelled")
	case SlotInUse:
		return true
	}
	return false
}

// gcCancelled forgets cancellations older than CancelTTL: they sit at the
// front of the queue, so this costs O(1) per forgotten rid and nothing
// when none expired.
func (t *Table) gcCancelled() {
	now := t.now()
	for t.cancelQ.len() > 0 && now.Sub(t.cancelQ.front().at) > t.cfg.CancelTTL {
		delete(t.cancelled, t.cancelQ.front().rid)
		t.cancelQ.pop()
	}
}

// Cancelled counts the cancelled rids remembered now.
func (t *Table) Cancelled() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.cancelled)
}
