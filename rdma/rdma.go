// Package rdma is the transfer-engine layer of the prefill -> decode handoff.
//
// An Engine moves bytes with one-sided writes: the sender names a registered
// local region and a remote region that the receiver has opened for writing,
// and the bytes land in the receiver's memory with no receiver-side request
// buffer. The ctrl protocol (package pd) decides when a remote region is open
// (only between accept and done, for one request and one slot generation);
// the engine enforces it by refusing writes whose key does not match.
//
// Backends: the built-in TCP engine (NewTCP) and NVIDIA NIXL (package
// rdma/nixl), opened at run time so binaries stay cgo-free.
package rdma

import (
	"context"
	"fmt"

	"github.com/cockroachdb/errors"
)

// MemKind says where a region lives.
type MemKind string

const (
	// HostMem is ordinary process memory (a Go byte slice or mmap).
	HostMem MemKind = "host"
	// DeviceMem is GPU memory. It is an extension point: the GPU backend
	// registers device pointers through Region.Addr/Device once it exists;
	// engines that cannot reach device memory refuse it at Register.
	DeviceMem MemKind = "device"
)

// RegionID names a registered region inside one engine.
type RegionID uint32

// Region is memory handed to an engine. For HostMem, Host is the memory and
// must stay alive and unmoved until Deregister (use memory outside the Go
// heap, or a slice the caller keeps referenced; Go's GC does not move heap
// objects today, and NIXL pins the pages it registers).
type Region struct {
	ID     RegionID
	Kind   MemKind
	Host   []byte  // HostMem
	Addr   uintptr // DeviceMem: device pointer
	Len    int64   // DeviceMem: length in bytes
	Device int     // DeviceMem: CUDA device ordinal
}

// Size is the region's length in bytes.
func (r Region) Size() int64 {
	if r.Kind == DeviceMem {
		return r.Len
	}
	return int64(len(r.Host))
}

func (r Region) validate() error {
	switch r.Kind {
	case HostMem, "":
		if len(r.Host) == 0 {
			return errors.Newf("rdma: region %d: empty host memory", r.ID)
		}
	case DeviceMem:
		if r.Addr == 0 || r.Len <= 0 {
			return errors.Newf("rdma: region %d: device region needs Addr and Len", r.ID)
		}
	default:
		return errors.Newf("rdma: region %d: unknown memory kind %q", r.ID, r.Kind)
	}
	return nil
}

// Remote is what a peer needs to write into a region that its owner has
// opened. It travels in the ctrl protocol's accept message.
type Remote struct {
	ID     RegionID `json:"id"`
	Key    uint64   `json:"key"` // write permission; the ctrl protocol uses the slot generation
	Len    int64    `json:"len"`
	Kind   MemKind  `json:"kind,omitempty"`
	Addr   uint64   `json:"addr,omitempty"`   // nixl: base address of the registration
	Device int      `json:"device,omitempty"` // nixl: device id of the registration
	Meta   []byte   `json:"meta,omitempty"`   // nixl: agent metadata covering this registration (base64 in JSON)
}

// WriteOp copies Len bytes from the local region at LocalOff to the remote
// region at RemoteOff.
type WriteOp struct {
	Local     RegionID
	LocalOff  int64
	Remote    Remote
	RemoteOff int64
	Len       int64
}

// Engine is one process's transfer endpoint. It is both a receiver (regions
// opened with Open accept writes from peers) and a sender (Connect).
type Engine interface {
	// Kind is the backend name ("tcp", "nixl"), sent in the ctrl hello.
	Kind() string
	// Endpoint describes how peers reach this engine; Connect takes it.
	Endpoint() string
	// Register makes memory known to the engine, as a write source or target.
	Register(r Region) error
	// Deregister revokes and forgets a region.
	Deregister(id RegionID) error
	// Open lets peers write into region id with writes carrying key (non-zero)
	// and returns the descriptor they need. Opening again replaces the key.
	Open(id RegionID, key uint64) (Remote, error)
	// Revoke closes region id to writes. When it returns, no write will land
	// in the region until the next Open (writes in flight finish or are cut),
	// and the memory holds every write whose completion the sender saw: it is
	// the point after which the owner may read the region.
	Revoke(id RegionID) error
	// Connect reaches the engine at endpoint for writing.
	Connect(ctx context.Context, endpoint string) (Peer, error)
	// Close stops the engine and its peers.
	Close() error
}

// Peer is a connection for one-sided writes to one remote engine.
type Peer interface {
	// Write performs all ops and returns once every byte is in place in the
	// remote memory, or the first error. Safe for concurrent use.
	Write(ctx context.Context, ops []WriteOp) error
	Close() error
}

// ErrRefused marks a write the receiver refused: the region is unknown,
// not open, opened for another key (an older or newer generation), or the
// range is out of bounds.
var ErrRefused = errors.New("rdma: write refused by receiver")

// ErrClosed marks use of a closed engine or peer.
var ErrClosed = errors.New("rdma: closed")

func checkRange(what string, id RegionID, off, n, size int64) error {
	if off < 0 || n < 0 || off > size || n > size-off {
		return errors.Newf("rdma: %s region %d: range [%d,+%d) outside its %d bytes", what, id, off, n, size)
	}
	return nil
}

// String renders an op for logs.
func (w WriteOp) String() string {
	return fmt.Sprintf("write %d@%d -> %d@%d (%d bytes)", w.Local, w.LocalOff, w.Remote.ID, w.RemoteOff, w.Len)
}

// PeerOpener is an engine that can bind a region's write permission to one
// authenticated peer session: OpenFor(id, key, session) accepts writes that
// carry key only from streams that proved session (the ctrl connection that
// received the accept). The tcp engine implements it.
type PeerOpener interface {
	OpenFor(id RegionID, key uint64, session string) (Remote, error)
}

// SessionConnector is an engine whose streams introduce themselves with a
// ctrl session (see PeerOpener).
type SessionConnector interface {
	ConnectAs(ctx context.Context, endpoint, session string) (Peer, error)
}

// ErrUnauthorized marks a stream the receiver refused at its handshake:
// the two sides do not share the secret.
var ErrUnauthorized = errors.New("rdma: the receiver refused this side's credentials")
