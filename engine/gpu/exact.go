package gpu

import (
	"encoding/binary"
	"math"

	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/cuda/kernels"
	"github.com/tilert-go/tilert/engine"
)

// mlaKind is the element form of a device MLA cache.
type mlaKind int

const (
	mlaFP8  mlaKind = iota // fp8_ds_mla, 656 bytes per token (vLLM)
	mlaBF16                // bf16, 1152 bytes per token (vLLM "bfloat16")
	mlaF32                 // float32, 2304 bytes per token (exact mode)
)

// setCacheLayout decides the device caches. Serving mode keeps vLLM's
// layout (Layout()) in device memory, so the slot buffer is the exchange
// bytes. Exact mode keeps float32 caches, as the CPU engine's exact mode:
// per layer, MaxPages*64 entries of 576 floats (latent, RoPE'd key), then,
// where the layer has an indexer, as many 128-float keys; Layout() stays the
// exchange layout that Export and Import convert to and from.
func (e *backend) setCacheLayout(hasIdx []bool) {
	lay := e.layout
	e.mlaOff, e.idxOff = nil, nil
	if e.opts.Mode != engine.ModeExact {
		e.mla = mlaFP8
		if lay.MLACache == engine.CacheBF16 {
			e.mla = mlaBF16
		}
		for l := 0; l < lay.NumLayers; l++ {
			rm, _ := lay.Region(l, engine.RegionMLA)
			e.mlaOff = append(e.mlaOff, rm.Offset)
			off := int64(-1)
			if ri, ok := lay.Region(l, engine.RegionIndexer); ok {
				off = ri.Offset
			}
			e.idxOff = append(e.idxOff, off)
		}
		e.devSlot = lay.SlotBytes
		return
	}
	e.mla, e.idxF32 = mlaF32, true
	n := int64(lay.MaxPages * engine.BlockSize)
	var off int64
	for l := 0; l < lay.NumLayers; l++ {
		e.mlaOff = append(e.mlaOff, off)
		off += n * kernels.MLAF32TokenBytes
		if hasIdx[l] {
			e.idxOff = append(e.idxOff, off)
			off += n * kernels.IndexerF32Bytes
		} else {
			e.idxOff = append(e.idxOff, -1)
		}
	}
	e.devSlot = off
}

func (e *backend) exact() bool { return e.mla == mlaF32 }

// layerLen is the number of positions present in layer l's caches.
func (e *backend) layerLen(l, seqLen, mtpLen int) int {
	if e.cfg.IsMTPLayer(l) {
		return mtpLen
	}
	return seqLen
}

// importExact decodes the exchange bytes img (Layout()) of meta's used
// positions into float32 and uploads them into s's device caches, as the
// CPU engine's exact mode decodes its staging buffer.
func (e *backend) importExact(b device, s *slot, img []byte, meta engine.SlotMeta) error {
	lay := e.layout
	R, P, D := e.cfg.KVLoraRank, e.cfg.QKRopeHeadDim, e.cfg.IndexHeadDim
	for l := 0; l < lay.NumLayers; l++ {
		n := e.layerLen(l, meta.SeqLen, meta.MTPLen)
		if n == 0 {
			continue
		}
		rm, _ := lay.Region(l, engine.RegionMLA)
		v := make([]float32, n*(R+P))
		for p := 0; p < n; p++ {
			ent := img[rm.Offset+int64(p*lay.MLATokenBytes):]
			row := v[p*(R+P) : (p+1)*(R+P)]
			if lay.MLACache == engine.CacheBF16 {
				engine.DecodeMLABF16(row[:R], row[R:], ent)
			} else {
				engine.DecodeMLAFP8(row[:R], row[R:], ent)
			}
		}
		if err := b.upload(s.buf.Add(e.mlaOff[l]), f32Bytes(v)); err != nil {
			return err
		}
		ri, ok := lay.Region(l, engine.RegionIndexer)
		if !ok {
			continue
		}
		k := make([]float32, n*D)
		for p := 0; p < n; p++ {
			pg := img[ri.Offset+int64((p/engine.BlockSize)*ri.PageBytes):]
			engine.DecodeIndexerKey(k[p*D:(p+1)*D], pg[:ri.PageBytes], p%engine.BlockSize)
		}
		if err := b.upload(s.buf.Add(e.idxOff[l]), f32Bytes(k)); err != nil {
			return err
		}
	}
	// Uploads from pageable Go memory; wait before the slices go.
	return b.sync()
}

// exportExact quantises s's float32 caches into the exchange layout (lossy,
// as the CPU engine's exact-mode Export).
func (e *backend) exportExact(b device, s *slot, meta engine.SlotMeta) ([]byte, error) {
	lay := e.layout
	R, P, D := e.cfg.KVLoraRank, e.cfg.QKRopeHeadDim, e.cfg.IndexHeadDim
	img := make([]byte, lay.SlotBytes)
	for l := 0; l < lay.NumLayers; l++ {
		n := e.layerLen(l, meta.SeqLen, meta.MTPLen)
		if n == 0 {
			continue
		}
		rm, _ := lay.Region(l, engine.RegionMLA)
		raw := make([]byte, 4*n*(R+P))
		if err := b.download(raw, s.buf.Add(e.mlaOff[l])); err != nil {
			return nil, err
		}
		v := bytesF32(raw)
		for p := 0; p < n; p++ {
			ent := img[rm.Offset+int64(p*lay.MLATokenBytes) : rm.Offset+int64((p+1)*lay.MLATokenBytes)]
			row := v[p*(R+P) : (p+1)*(R+P)]
			if lay.MLACache == engine.CacheBF16 {
				engine.EncodeMLABF16(ent, row[:R], row[R:])
			} else {
				engine.EncodeMLAFP8(ent, row[:R], row[R:])
			}
		}
		ri, ok := lay.Region(l, engine.RegionIndexer)
		if !ok {
			continue
		}
		rawK := make([]byte, 4*n*D)
		if err := b.download(rawK, s.buf.Add(e.idxOff[l])); err != nil {
			return nil, err
		}
		k := bytesF32(rawK)
		for p := 0; p < n; p++ {
			pg := img[ri.Offset+int64((p/engine.BlockSize)*ri.PageBytes):]
			engine.EncodeIndexerKey(pg[:ri.PageBytes], p%engine.BlockSize, k[p*D:(p+1)*D])
		}
	}
	return img, nil
}

func bytesF32(b []byte) []float32 {
	out := make([]float32, len(b)/4)
	for i := range out {
		out[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return out
}

var errExactDeviceBuffer = errors.WithHint(
	errors.New("exact mode keeps float32 caches on the device: there is no device buffer in the exchange layout"),
	"write the state into SlotBuffer (host staging) and call Import, or run serving mode")
