package pd

import (
	"hash/crc32"
	"math/rand/v2"

	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/rdma"
)

// Castagnoli is the CRC-32C table used for done.checksum.
var Castagnoli = crc32.MakeTable(crc32.Castagnoli)

// SlotRegion is one named receive region of one slot.
type SlotRegion struct {
	Name   string
	Region rdma.Region // ID, memory; registered by NewEngineReceiver
}

// EngineReceiver is the Receiver over an rdma.Engine: each slot owns one registered
// region per name. Each Open uses a fresh random write key, so only the
// holder of that accept can write: a peer that guesses the slot or the
// generation is refused by the engine.
type EngineReceiver struct {
	eng   rdma.Engine
	slots [][]SlotRegion
	// DeviceChecksum computes done.checksum for device regions; nil until
	// the GPU backend provides it.
	DeviceChecksum func(r rdma.Region, off, n int64, crc uint32) (uint32, error)
}

// NewEngineReceiver registers every slot's regions with eng. All slots must
// have the same region names in the same order.
func NewEngineReceiver(eng rdma.Engine, slots [][]SlotRegion) (*EngineReceiver, error) {
	for i, s := range slots {
		if len(s) != len(slots[0]) {
			return nil, errors.Newf("pd: slot %d has %d regions, slot 0 has %d", i, len(s), len(slots[0]))
		}
		for j, r := range s {
			if r.Name != slots[0][j].Name {
				return nil, errors.Newf("pd: slot %d region %d is %q, slot 0 has %q", i, j, r.Name, slots[0][j].Name)
			}
			if err := eng.Register(r.Region); err != nil {
				return nil, errors.Wrapf(err, "pd: register slot %d region %q", i, r.Name)
			}
			// Every slot starts closed; only an accept opens it.
			if err := eng.Revoke(r.Region.ID); err != nil {
				return nil, errors.Wrapf(err, "pd: close slot %d region %q", i, r.Name)
			}
		}
	}
	return &EngineReceiver{eng: eng, slots: slots}, nil
}

// Caps lists the per-slot capacity of each region (the smallest over slots).
func (g *EngineReceiver) Caps() []RegionCap {
	if len(g.slots) == 0 {
		return nil
	}
	caps := make([]RegionCap, len(g.slots[0]))
	for j, r := range g.slots[0] {
		caps[j] = RegionCap{Name: r.Name, Capacity: r.Region.Size()}
		for _, s := range g.slots[1:] {
			caps[j].Capacity = min(caps[j].Capacity, s[j].Region.Size())
		}
	}
	return caps
}

// Region returns slot's region called name.
func (g *EngineReceiver) Region(slot int, name string) (rdma.Region, bool) {
	if slot < 0 || slot >= len(g.slots) {
		return rdma.Region{}, false
	}
	for _, r := range g.slots[slot] {
		if r.Name == name {
			return r.Region, true
		}
	}
	return rdma.Region{}, false
}

// Open implements Receiver. With an engine that binds writes to a peer
// (rdma.PeerOpener) and a known peer, only that ctrl session's transfer
// streams may write.
func (g *EngineReceiver) Open(slot int, _ uint64, peer string, sizes []RegionSize) ([]Destination, error) {
	dests := make([]Destination, 0, len(sizes))
	key := rand.Uint64() | 1 // non-zero; math/rand/v2's global source is ChaCha8, seeded from the OS
	for _, sz := range sizes {
		r, ok := g.Region(slot, sz.Name)
		if !ok {
			return nil, errors.Newf("pd: slot %d has no region %q", slot, sz.Name)
		}
		var rem rdma.Remote
		var err error
		if po, ok := g.eng.(rdma.PeerOpener); ok && peer != "" {
			rem, err = po.OpenFor(r.ID, key, peer)
		} else {
			rem, err = g.eng.Open(r.ID, key)
		}
		if err != nil {
			return nil, err
		}
		dests = append(dests, Destination{Name: sz.Name, Offset: 0, Bytes: sz.Bytes, Remote: rem})
	}
	return dests, nil
}

// Close implements Receiver.
func (g *EngineReceiver) Close(slot int) error {
	if slot < 0 || slot >= len(g.slots) {
		return errNoSuchSlot
	}
	var first error
	for _, r := range g.slots[slot] {
		if err := g.eng.Revoke(r.Region.ID); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// Checksum implements Receiver.
func (g *EngineReceiver) Checksum(slot int, dests []Destination) (uint32, error) {
	var crc uint32
	for _, d := range dests {
		r, ok := g.Region(slot, d.Name)
		if !ok {
			return 0, errors.Newf("pd: slot %d has no region %q", slot, d.Name)
		}
		if r.Kind == rdma.DeviceMem {
			if g.DeviceChecksum == nil {
				return 0, errors.Newf("pd: slot %d region %q is device memory and no device checksum is set", slot, d.Name)
			}
			var err error
			if crc, err = g.DeviceChecksum(r, d.Offset, d.Bytes, crc); err != nil {
				return 0, err
			}
			continue
		}
		crc = crc32.Update(crc, Castagnoli, r.Host[d.Offset:d.Offset+d.Bytes])
	}
	return crc, nil
}
