package gpu

import (
	"encoding/binary"
	"math"

	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/cuda"
	"github.com/tilert-go/tilert/engine"
)

// DeviceSlotBuffer is slot's live cache in device memory (Layout().SlotBytes
// bytes at the returned address): what a transfer engine that writes device
// memory (NIXL over GPUDirect) registers as the slot's receive buffer. Only
// valid while the engine is open; write it only while the slot is free.
func (e *Engine) DeviceSlotBuffer(slotID int) (cuda.DevPtr, int64, error) {
	if _, err := e.SlotBuffer(slotID); err != nil { // checks slotID
		return 0, 0, err
	}
	if e.m.exact() {
		return 0, 0, errExactDeviceBuffer
	}
	return e.m.slots[slotID].buf, e.m.layout.SlotBytes, nil
}

// SlotBuffer implements engine.Backend with a pinned host staging buffer:
// the live cache is device memory (DeviceSlotBuffer), so bytes written here
// reach the device by DMA when Import is called with segs == nil (the used
// pages of every region are uploaded). A host transfer engine (tcp) writes
// here; the buffer stays at the same address until Close.
func (e *backend) SlotBuffer(slotID int) ([]byte, error) {
	// A transfer engine may write the slot (here, or its device memory
	// through DeviceSlotBuffer) once it has the buffer: nothing started
	// ahead may still write it then.
	e.Drain()
	if err := e.ah.err; err != nil {
		e.ah.err = nil
		return nil, err
	}
	s := e.slots[slotID]
	if s.staging == nil {
		err := e.r.run(func(b device) error {
			buf, free, err := b.hostAlloc(int(e.layout.SlotBytes))
			s.staging, s.freeStaging = buf, free
			return err
		})
		if err != nil {
			return nil, errors.Wrapf(err, "slot %d: pinned staging buffer of %d bytes", slotID, e.layout.SlotBytes)
		}
	}
	return s.staging, nil
}

// Import implements engine.Backend: segs are copied host to device into the
// slot's cache; with segs == nil the used pages of the staging buffer
// (SlotBuffer) are.
func (e *backend) Import(slotID int, meta engine.SlotMeta, segs []engine.Segment) error {
	if err := e.settle(); err != nil {
		return err
	}
	s := e.slots[slotID]
	if segs == nil && s.staging == nil {
		return errors.Wrapf(engine.ErrBadLayout, "import into slot %d without segments, but nothing was written to its SlotBuffer", slotID)
	}
	if e.exact() {
		img := s.staging
		if segs != nil {
			img = make([]byte, e.layout.SlotBytes)
			for _, sg := range segs {
				copy(img[sg.Offset:], sg.Data)
			}
		}
		return e.r.run(func(b device) error { return e.importExact(b, s, img, meta) })
	}
	if segs == nil {
		segs = e.layout.UsedSegments(s.staging, meta.SeqLen)
	}
	return e.uploadSegments(s, segs)
}

// uploadSegments copies serving-mode exchange bytes into s's device cache.
func (e *backend) uploadSegments(s *slot, segs []engine.Segment) error {
	return e.r.run(func(b device) error {
		for _, sg := range segs {
			if err := b.upload(s.buf.Add(sg.Offset), sg.Data); err != nil {
				return err
			}
		}
		// The copies are asynchronous from pinned memory; the caller may
		// reuse the staging buffer or the segments once Import returns.
		return b.sync()
	})
}

// Export implements engine.Backend: the used pages of every region, copied
// device to host.
func (e *backend) Export(slotID int, meta engine.SlotMeta) ([]engine.Segment, error) {
	if err := e.settle(); err != nil {
		return nil, err
	}
	s := e.slots[slotID]
	if e.exact() {
		var img []byte
		err := e.r.run(func(b device) error {
			var err error
			img, err = e.exportExact(b, s, meta)
			return err
		})
		if err != nil {
			return nil, err
		}
		return e.layout.UsedSegments(img, meta.SeqLen), nil
	}
	pages := (meta.SeqLen + engine.BlockSize - 1) / engine.BlockSize
	var segs []engine.Segment
	for _, r := range e.layout.Regions {
		segs = append(segs, engine.Segment{Offset: r.Offset, Data: make([]byte, pages*r.PageBytes)})
	}
	err := e.r.run(func(b device) error {
		for _, sg := range segs {
			if err := b.download(sg.Data, s.buf.Add(sg.Offset)); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return segs, nil
}

// TeacherForce forwards toks at positions 0.. through slot (which must be
// free; it is left free) and returns every position's logits and, when the
// model has an MTP layer, the MTP logits of positions 0..len(toks)-2 (fed
// the main hidden of j and token j+1). A diagnostic for comparing logits
// with other implementations (the HF goldens, the CPU engine).
func (g *Engine) TeacherForce(slotID int, toks []int) (logits, mtp [][]float32, err error) {
	if err := g.CheckFree(slotID); err != nil {
		return nil, nil, err
	}
	e := g.m
	if err := e.settle(); err != nil {
		return nil, nil, err
	}
	s := e.slots[slotID]
	if len(toks) == 0 || len(toks) >= e.maxSeq {
		return nil, nil, errors.Wrapf(engine.ErrTooLong, "%d tokens (max_seq_len %d)", len(toks), e.maxSeq)
	}
	if err := engine.CheckTokens(e.cfg.VocabSize, toks...); err != nil {
		return nil, nil, err
	}
	c := e.cfg
	V, H := c.VocabSize, c.HiddenSize
	L := len(toks)
	err = e.r.run(func(b device) error {
		o := &ops{b: b}
		for lo := 0; lo < L; lo += e.chunkLen {
			hi := min(lo+e.chunkLen, L)
			rows := make([]fwdRow, hi-lo)
			for i := range rows {
				rows[i] = fwdRow{s: s, tok: toks[lo+i], pos: lo + i}
			}
			e.forward(o, rows, false, nil)
			logits = append(logits, e.downloadRows(o, e.ws.logits, hi-lo, V)...)
			if n := min(hi, L-1) - lo; e.hasMTP() && n > 0 {
				mrows := make([]fwdRow, n)
				for i := range mrows {
					mrows[i] = fwdRow{s: s, tok: toks[lo+i+1], pos: lo + i}
				}
				o.do(b.copyDD(e.ws.hin, e.ws.hid, int64(4*n*H)))
				e.forward(o, mrows, true, nil)
				mtp = append(mtp, e.downloadRows(o, e.ws.logits, n, V)...)
			}
			if o.err != nil {
				return o.err
			}
		}
		return o.err
	})
	return logits, mtp, err
}

func (e *backend) downloadRows(o *ops, p cuda.DevPtr, rows, n int) [][]float32 {
	if o.err != nil {
		return nil
	}
	b := make([]byte, 4*rows*n)
	o.do(o.b.download(b, p))
	out := make([][]float32, rows)
	for i := range out {
		out[i] = make([]float32, n)
		for j := range out[i] {
			out[i][j] = f32At(b, i*n+j)
		}
	}
	return out
}

func f32At(b []byte, i int) float32 {
	return math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
}
