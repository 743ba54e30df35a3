package cpu

import (
	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/engine"
)

// SlotBuffer implements engine.Engine. In serving mode it is the slot's live
// cache; in exact mode a staging buffer decoded into float32 on Import.
func (e *Engine) SlotBuffer(slotID int) ([]byte, error) {
	s, err := e.slot(slotID)
	if err != nil {
		return nil, err
	}
	if s.buf == nil {
		s.buf = make([]byte, e.layout.SlotBytes)
	}
	return s.buf, nil
}

// Import implements engine.Engine.
func (e *Engine) Import(slotID int, meta engine.SlotMeta, segs []engine.Segment) error {
	s, err := e.slot(slotID)
	if err != nil {
		return err
	}
	if s.state != slotFree {
		return errors.Wrapf(engine.ErrSlotBusy, "import into slot %d: it is %s", slotID, s.state)
	}
	if err := engine.CheckImport(meta, segs, e.maxSeq, e.cfg.VocabSize, e.opts.MTP, e.layout.SlotBytes); err != nil {
		return err
	}
	buf, _ := e.SlotBuffer(slotID)
	for _, sg := range segs {
		copy(buf[sg.Offset:], sg.Data)
	}
	if e.opts.Mode == engine.ModeExact {
		e.decodeInto(s, meta)
	}
	s.state = slotLoaded
	s.seqLen, s.mtpLen, s.lastToken = meta.SeqLen, meta.MTPLen, meta.LastToken
	s.lastHidden, s.mtpTok, s.mtpDraft, s.draft = nil, -1, -1, -1
	return nil
}

// decodeInto converts the staging bytes of s into its float32 caches.
func (e *Engine) decodeInto(s *slot, meta engine.SlotMeta) {
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

// Export implements engine.Engine.
func (e *Engine) Export(slotID int) (engine.SlotMeta, []engine.Segment, error) {
	s, err := e.slot(slotID)
	if err != nil {
		return engine.SlotMeta{}, nil, err
	}
	if s.state == slotFree {
		return engine.SlotMeta{}, nil, errors.Wrapf(engine.ErrSlotState, "export slot %d: it is free", slotID)
	}
	meta := engine.SlotMeta{SeqLen: s.seqLen, MTPLen: s.mtpLen, LastToken: s.lastToken}
	buf := s.buf
	if e.opts.Mode == engine.ModeExact {
		// Lossy: float32 caches quantised into the exchange layout.
		buf = make([]byte, e.layout.SlotBytes)
		bc := newByteCaches(e.layout, buf)
		c := e.cfg
		lat, rope, k := make([]float32, c.KVLoraRank), make([]float32, c.QKRopeHeadDim), make([]float32, c.IndexHeadDim)
		for l := range s.caches {
			n := s.seqLen
			if c.IsMTPLayer(l) {
				n = s.mtpLen
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
	segs := e.layout.UsedSegments(buf, s.seqLen)
	for i := range segs {
		segs[i].Data = append([]byte(nil), segs[i].Data...)
	}
	return meta, segs, nil
}
