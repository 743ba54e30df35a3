package gpu

import (
	"encoding/binary"
	"math"

	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/engine"
	cuda "github.com/tilert-go/tilert/gpu"
)

// DeviceSlotBuffer is slot's live cache in device memory (Layout().SlotBytes
// bytes at the returned address): what a transfer engine that writes device
// memory (NIXL over GPUDirect) registers as the slot's receive buffer. Only
// valid while the engine is open; write it only while the slot is free.
func (e *Engine) DeviceSlotBuffer(slotID int) (cuda.DevPtr, int64, error) {
	s, err := e.slot(slotID)
	if err != nil {
		return 0, 0, err
	}
	if e.exact() {
		return 0, 0, errExactDeviceBuffer
	}
	return s.buf, e.layout.SlotBytes, nil
}

// SlotBuffer implements engine.Engine with a pinned host staging buffer:
// the live cache is device memory (DeviceSlotBuffer), so bytes written here
// reach the device by DMA when Import is called with segs == nil (the used
// pages of every region are uploaded). A host transfer engine (tcp) writes
// here; the buffer stays at the same address until Close.
func (e *Engine) SlotBuffer(slotID int) ([]byte, error) {
	s, err := e.slot(slotID)
	if err != nil {
		return nil, err
	}
	if s.staging == nil {
		err := e.r.run(func(b backend) error {
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

// Import implements engine.Engine: segs are copied host to device into the
// slot's cache; with segs == nil the used pages of the staging buffer
// (SlotBuffer) are.
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
		err = e.r.run(func(b backend) error { return e.importExact(b, s, img, meta) })
	} else {
		if segs == nil {
			segs = e.layout.UsedSegments(s.staging, meta.SeqLen)
		}
		err = e.uploadSegments(s, segs)
	}
	if err != nil {
		return err
	}
	s.state = slotLoaded
	s.seqLen, s.mtpLen, s.lastToken = meta.SeqLen, meta.MTPLen, meta.LastToken
	s.hasHidden, s.mtpTok, s.mtpDraft, s.draft = false, -1, -1, -1
	return nil
}

// uploadSegments copies serving-mode exchange bytes into s's device cache.
func (e *Engine) uploadSegments(s *slot, segs []engine.Segment) error {
	return e.r.run(func(b backend) error {
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

// Export implements engine.Engine: the used pages of every region, copied
// device to host.
func (e *Engine) Export(slotID int) (engine.SlotMeta, []engine.Segment, error) {
	s, err := e.slot(slotID)
	if err != nil {
		return engine.SlotMeta{}, nil, err
	}
	if s.state == slotFree {
		return engine.SlotMeta{}, nil, errors.Wrapf(engine.ErrSlotState, "export slot %d: it is free", slotID)
	}
	meta := engine.SlotMeta{SeqLen: s.seqLen, MTPLen: s.mtpLen, LastToken: s.lastToken}
	if e.exact() {
		var img []byte
		err := e.r.run(func(b backend) error {
			var err error
			img, err = e.exportExact(b, s)
			return err
		})
		if err != nil {
			return engine.SlotMeta{}, nil, err
		}
		return meta, e.layout.UsedSegments(img, s.seqLen), nil
	}
	pages := (s.seqLen + engine.BlockSize - 1) / engine.BlockSize
	var segs []engine.Segment
	for _, r := range e.layout.Regions {
		segs = append(segs, engine.Segment{Offset: r.Offset, Data: make([]byte, pages*r.PageBytes)})
	}
	err = e.r.run(func(b backend) error {
		for _, sg := range segs {
			if err := b.download(sg.Data, s.buf.Add(sg.Offset)); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return engine.SlotMeta{}, nil, err
	}
	return meta, segs, nil
}

// TeacherForce forwards toks at positions 0.. through slot (which must be
// free; it is left free) and returns every position's logits and, when the
// model has an MTP layer, the MTP logits of positions 0..len(toks)-2 (fed
// the main hidden of j and token j+1). A diagnostic for comparing logits
// with other implementations (the HF goldens, the CPU engine).
func (e *Engine) TeacherForce(slotID int, toks []int) (logits, mtp [][]float32, err error) {
	s, err := e.slot(slotID)
	if err != nil {
		return nil, nil, err
	}
	if s.state != slotFree {
		return nil, nil, errors.Wrapf(engine.ErrSlotBusy, "slot %d is %s", slotID, s.state)
	}
	if len(toks) == 0 || len(toks) >= e.maxSeq {
		return nil, nil, errors.Wrapf(engine.ErrTooLong, "%d tokens (max_seq_len %d)", len(toks), e.maxSeq)
	}
	if err := e.checkTokens(toks...); err != nil {
		return nil, nil, err
	}
	c := e.cfg
	V, H := c.VocabSize, c.HiddenSize
	L := len(toks)
	err = e.r.run(func(b backend) error {
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
	e.resetSlot(s)
	return logits, mtp, err
}

func (e *Engine) downloadRows(o *ops, p cuda.DevPtr, rows, n int) [][]float32 {
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
