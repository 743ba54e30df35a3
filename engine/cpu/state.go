package cpu

import (
	"github.com/tilert-go/tilert/engine"
)

// SlotBuffer implements engine.Backend. In serving mode it is the slot's
// live cache; in exact mode a staging buffer decoded into float32 on Import.
func (e *backend) SlotBuffer(slotID int) ([]byte, error) {
	s := e.slots[slotID]
	if s.buf == nil {
		s.buf = make([]byte, e.layout.SlotBytes)
	}
	return s.buf, nil
}

// Import implements engine.Backend.
func (e *backend) Import(slotID int, meta engine.SlotMeta, segs []engine.Segment) error {
	s := e.slots[slotID]
	buf, _ := e.SlotBuffer(slotID)
	for _, sg := range segs {
		copy(buf[sg.Offset:], sg.Data)
	}
	if e.opts.Mode == engine.ModeExact {
		e.decodeInto(s, meta)
	}
	s.lastHidden = nil
	return nil
}

// decodeInto converts the staging bytes of s into its float32 caches.
func (e *backend) decodeInto(s *slot, meta engine.SlotMeta) {
	c := e.cfg
	bc := newByteCaches(e.layout, s.buf)
	lat, rope, k := make([]float32, c.KVLoraRank), make([]float32, c.QKRopeHeadDim), make([]float32, c.IndexHeadDim)
	for l := range s.caches {
		n := meta.SeqLen
		if c.IsMTPLayer(l) {
			n = meta.MTPLen
		}
		hasIdx := c.HasIndexer(l)
		for p := 0; p < n; p++ {
			bc[l].readMLA(p, lat, rope)
			s.caches[l].writeMLA(p, lat, rope)
			if hasIdx {
				bc[l].readIdx(p, k)
				s.caches[l].writeIdx(p, k)
			}
		}
	}
}

// Export implements engine.Backend.
func (e *backend) Export(slotID int, meta engine.SlotMeta) ([]engine.Segment, error) {
	s := e.slots[slotID]
	buf := s.buf
	if e.opts.Mode == engine.ModeExact {
		// Lossy: float32 caches quantised into the exchange layout.
		buf = make([]byte, e.layout.SlotBytes)
		bc := newByteCaches(e.layout, buf)
		c := e.cfg
		lat, rope, k := make([]float32, c.KVLoraRank), make([]float32, c.QKRopeHeadDim), make([]float32, c.IndexHeadDim)
		for l := range s.caches {
			n := meta.SeqLen
			if c.IsMTPLayer(l) {
				n = meta.MTPLen
			}
			for p := 0; p < n; p++ {
				s.caches[l].readMLA(p, lat, rope)
				bc[l].writeMLA(p, lat, rope)
				if c.HasIndexer(l) {
					s.caches[l].readIdx(p, k)
					bc[l].writeIdx(p, k)
				}
			}
		}
	}
	segs := e.layout.UsedSegments(buf, meta.SeqLen)
	for i := range segs {
		segs[i].Data = append([]byte(nil), segs[i].Data...)
	}
	return segs, nil
}
