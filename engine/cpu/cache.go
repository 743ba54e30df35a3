package cpu

import (
	"github.com/tilert-go/tilert/engine"
)

// layerCache is one layer's per-slot cache: the MLA latent + RoPE key per
// position and the indexer key per position. Reads return dequantised
// float32 values.
type layerCache interface {
	writeMLA(pos int, latent, rope []float32)
	readMLA(pos int, latent, rope []float32)
	writeIdx(pos int, k []float32)
	readIdx(pos int, k []float32)
}

// f32Cache is the exact-mode cache.
type f32Cache struct {
	r, p, d   int
	lat, rope []float32
	idx       []float32
}

func newF32Cache(maxSeq, r, p, d int, hasIdx bool) *f32Cache {
	c := &f32Cache{r: r, p: p, d: d, lat: make([]float32, maxSeq*r), rope: make([]float32, maxSeq*p)}
	if hasIdx {
		c.idx = make([]float32, maxSeq*d)
	}
	return c
}

func (c *f32Cache) writeMLA(pos int, latent, rope []float32) {
	copy(c.lat[pos*c.r:(pos+1)*c.r], latent)
	copy(c.rope[pos*c.p:(pos+1)*c.p], rope)
}

func (c *f32Cache) readMLA(pos int, latent, rope []float32) {
	copy(latent, c.lat[pos*c.r:(pos+1)*c.r])
	copy(rope, c.rope[pos*c.p:(pos+1)*c.p])
}

func (c *f32Cache) writeIdx(pos int, k []float32) { copy(c.idx[pos*c.d:(pos+1)*c.d], k) }
func (c *f32Cache) readIdx(pos int, k []float32)  { copy(k, c.idx[pos*c.d:(pos+1)*c.d]) }

// byteCache is the serving-mode cache: views into the slot buffer in vLLM's
// layouts (engine/layout.go), so the bytes are exactly what crosses.
type byteCache struct {
	dt       engine.CacheDType
	tokBytes int
	mla      []byte // MaxPages*64 token entries
	idx      []byte // MaxPages indexer pages (nil without an indexer)
	pageB    int
}

func (c *byteCache) writeMLA(pos int, latent, rope []float32) {
	e := c.mla[pos*c.tokBytes : (pos+1)*c.tokBytes]
	if c.dt == engine.CacheBF16 {
		engine.EncodeMLABF16(e, latent, rope)
	} else {
		engine.EncodeMLAFP8(e, latent, rope)
	}
}

func (c *byteCache) readMLA(pos int, latent, rope []float32) {
	e := c.mla[pos*c.tokBytes : (pos+1)*c.tokBytes]
	if c.dt == engine.CacheBF16 {
		engine.DecodeMLABF16(latent, rope, e)
	} else {
		engine.DecodeMLAFP8(latent, rope, e)
	}
}

func (c *byteCache) page(pos int) ([]byte, int) {
	p := pos / engine.BlockSize
	return c.idx[p*c.pageB : (p+1)*c.pageB], pos % engine.BlockSize
}

func (c *byteCache) writeIdx(pos int, k []float32) {
	pg, t := c.page(pos)
	engine.EncodeIndexerKey(pg, t, k)
}

func (c *byteCache) readIdx(pos int, k []float32) {
	pg, t := c.page(pos)
	engine.DecodeIndexerKey(k, pg, t)
}

// newByteCaches slices a slot buffer into per-layer caches.
func newByteCaches(l engine.Layout, buf []byte) []layerCache {
	out := make([]layerCache, l.NumLayers)
	n := int64(l.MaxPages)
	for i := 0; i < l.NumLayers; i++ {
		c := &byteCache{dt: l.MLACache, tokBytes: l.MLATokenBytes, pageB: l.IndexerPageBytes}
		r, _ := l.Region(i, engine.RegionMLA)
		c.mla = buf[r.Offset : r.Offset+n*int64(r.PageBytes)]
		if ri, ok := l.Region(i, engine.RegionIndexer); ok {
			c.idx = buf[ri.Offset : ri.Offset+n*int64(ri.PageBytes)]
		}
		out[i] = c
	}
	return out
}
