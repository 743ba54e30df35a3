package engine

import (
	"encoding/binary"
	"math"

	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/numeric"
)

// CacheDType names the MLA cache layout (vLLM's kv_cache_dtype).
type CacheDType string

const (
	// CacheFP8DSMLA is vLLM's "fp8_ds_mla" (DeepSeek FlashMLA sparse fp8).
	CacheFP8DSMLA CacheDType = "fp8_ds_mla"
	// CacheBF16 is vLLM's "bfloat16"/"auto" MLA cache.
	CacheBF16 CacheDType = "bfloat16"
)

// ParseCacheDType accepts fp8_ds_mla, bfloat16 (or bf16/auto).
func ParseCacheDType(s string) (CacheDType, error) {
	switch s {
	case "", "fp8_ds_mla", "fp8":
		return CacheFP8DSMLA, nil
	case "bfloat16", "bf16", "auto":
		return CacheBF16, nil
	}
	return "", errors.WithHint(errors.Newf("unknown MLA cache dtype %q", s), "use fp8_ds_mla or bfloat16")
}

// LayoutVersion identifies the byte layouts below; the ctrl protocol's hello
// carries it so mismatched peers refuse to exchange state.
const LayoutVersion = "vllm-mla-dsa-v1"

// BlockSize is vLLM's cache block (page) size in tokens for these models.
const BlockSize = 64

// Byte layouts (all little-endian), one token or one 64-token page:
//
// MLA cache, fp8_ds_mla, kv_lora_rank R=512, rope dim P=64: 656 bytes/token,
// token-major inside a page (page p of a layer holds positions 64p..64p+63 at
// consecutive 656-byte strides):
//
//	[0, R)              R fp8 e4m3 bytes: latent[i] / scale[i/128], round to
//	                    nearest even, saturated to +-448 (vLLM
//	                    concat_and_cache_ds_mla: latent is the bf16 kv_a_layernorm
//	                    output)
//	[R, R+4*R/128)      R/128 float32 scales, scale[j] = max(amax_j/448, FLT_MIN)
//	                    where amax_j = max |latent| over values 128j..128j+127
//	[R+16, R+16+2P)     P bf16 RoPE'd key values, not quantised, in vLLM's order:
//	                    GPT-J style (interleaved pairs rotated in place)
//
// MLA cache, bfloat16: 1152 bytes/token = R bf16 latent then P bf16 RoPE key.
//
// Indexer key cache (DSA), head dim D=128, quant block 128: one page of 64
// tokens is 8448 bytes, block-major (vLLM indexer_k_quant_and_cache):
//
//	[0, 64*D)           64 tokens x D fp8 e4m3 values, token t at t*D
//	[64*D, 64*D+256)    64 float32 scales, token t at 64*D + 4t; each scale is a
//	                    power of two (ue8m0): smallest 2^k >= max(amax,1e-4)/448
//
// The indexer key is k_norm(wk(x)) with RoPE applied to its first P dims
// (half-split for DeepSeek-V3.2, interleaved pairs in place for GLM-5), rounded
// to bf16 before quantisation. vLLM applies no Hadamard rotation to the
// indexer q/k of DeepSeek-V3.2/GLM-5 (checked in vllm deepseek_v2.py Indexer
// and sparse_attn_indexer.py), so neither do we.
//
// A slot buffer holds, for each layer l = 0..NumLayers (the MTP layer last),
// its MLA region (MaxPages pages) followed by its indexer region (MaxPages
// pages; absent for GLM layers that share the previous layer's top-k).

// RegionKind distinguishes the two cache regions of a layer.
type RegionKind string

const (
	RegionMLA     RegionKind = "mla"
	RegionIndexer RegionKind = "indexer"
)

// Region is one layer's cache region inside a slot buffer.
type Region struct {
	Layer     int
	Kind      RegionKind
	Offset    int64 // byte offset of page 0 in the slot buffer
	PageBytes int   // bytes per 64-token page
}

// Layout describes one slot's state bytes.
type Layout struct {
	MLACache         CacheDType
	KVLoraRank       int
	RopeDim          int
	IndexHeadDim     int
	MLATokenBytes    int // 656 (fp8_ds_mla) or 1152 (bfloat16) for R=512, P=64
	IndexerPageBytes int // 8448 for D=128
	MaxPages         int // pages per region
	NumLayers        int // including the MTP layer(s)
	Regions          []Region
	SlotBytes        int64
}

// MLATokenBytes returns the per-token MLA cache size for a dtype.
func MLATokenBytes(dt CacheDType, kvLoraRank, ropeDim int) int {
	if dt == CacheBF16 {
		return 2 * (kvLoraRank + ropeDim)
	}
	return kvLoraRank + 4*(kvLoraRank/128) + 2*ropeDim
}

// IndexerPageBytes returns the bytes of one 64-token indexer page.
func IndexerPageBytes(headDim int) int {
	return BlockSize*headDim + BlockSize*4*(headDim/128)
}

// NewLayout builds the slot layout. hasIndexer[l] says whether layer l keeps
// an indexer key cache.
func NewLayout(dt CacheDType, kvLoraRank, ropeDim, indexHeadDim, maxSeqLen int, hasIndexer []bool) (Layout, error) {
	if kvLoraRank%128 != 0 || indexHeadDim%128 != 0 {
		return Layout{}, errors.Newf("vLLM cache layouts need kv_lora_rank and index_head_dim multiples of 128 (got %d, %d)", kvLoraRank, indexHeadDim)
	}
	l := Layout{
		MLACache: dt, KVLoraRank: kvLoraRank, RopeDim: ropeDim, IndexHeadDim: indexHeadDim,
		MLATokenBytes:    MLATokenBytes(dt, kvLoraRank, ropeDim),
		IndexerPageBytes: IndexerPageBytes(indexHeadDim),
		MaxPages:         (maxSeqLen + BlockSize - 1) / BlockSize,
		NumLayers:        len(hasIndexer),
	}
	var off int64
	for i, hi := range hasIndexer {
		mp := l.MLATokenBytes * BlockSize
		l.Regions = append(l.Regions, Region{Layer: i, Kind: RegionMLA, Offset: off, PageBytes: mp})
		off += int64(mp) * int64(l.MaxPages)
		if hi {
			l.Regions = append(l.Regions, Region{Layer: i, Kind: RegionIndexer, Offset: off, PageBytes: l.IndexerPageBytes})
			off += int64(l.IndexerPageBytes) * int64(l.MaxPages)
		}
	}
	l.SlotBytes = off
	return l, nil
}

// Region returns layer's region of the given kind.
func (l *Layout) Region(layer int, kind RegionKind) (Region, bool) {
	for _, r := range l.Regions {
		if r.Layer == layer && r.Kind == kind {
			return r, true
		}
	}
	return Region{}, false
}

// UsedSegments returns, for a state of seqLen positions, the used pages of
// every region as segments of buf (views, not copies).
func (l *Layout) UsedSegments(buf []byte, seqLen int) []Segment {
	pages := (seqLen + BlockSize - 1) / BlockSize
	segs := make([]Segment, 0, len(l.Regions))
	for _, r := range l.Regions {
		n := int64(pages * r.PageBytes)
		segs = append(segs, Segment{Offset: r.Offset, Data: buf[r.Offset : r.Offset+n]})
	}
	return segs
}

// --- MLA token entries ---

// EncodeMLAFP8 writes one fp8_ds_mla token entry (len MLATokenBytes) from
// the latent (kv_lora_rank) and RoPE'd key (rope dim). Inputs are rounded to
// bf16 first, as vLLM's are bf16 tensors.
func EncodeMLAFP8(dst []byte, latent, rope []float32) {
	r := len(latent)
	var tile [128]float32
	for j := 0; j < r/128; j++ {
		var amax float32
		for i := 0; i < 128; i++ {
			v := roundBF16(latent[j*128+i])
			tile[i] = v
			amax = max(amax, float32(math.Abs(float64(v))))
		}
		scale := max(amax/448, 0x1p-126) // FLT_MIN, as vLLM
		binary.LittleEndian.PutUint32(dst[r+4*j:], math.Float32bits(scale))
		for i := 0; i < 128; i++ {
			dst[j*128+i] = numeric.Float32ToFP8E4M3(tile[i] / scale)
		}
	}
	ro := r + 4*(r/128)
	for i, v := range rope {
		binary.LittleEndian.PutUint16(dst[ro+2*i:], numeric.Float32ToBF16(v))
	}
}

// DecodeMLAFP8 reads one fp8_ds_mla token entry.
func DecodeMLAFP8(latent, rope []float32, src []byte) {
	r := len(latent)
	for j := 0; j < r/128; j++ {
		scale := math.Float32frombits(binary.LittleEndian.Uint32(src[r+4*j:]))
		for i := 0; i < 128; i++ {
			latent[j*128+i] = numeric.FP8E4M3ToFloat32(src[j*128+i]) * scale
		}
	}
	ro := r + 4*(r/128)
	for i := range rope {
		rope[i] = numeric.BF16ToFloat32(binary.LittleEndian.Uint16(src[ro+2*i:]))
	}
}

// EncodeMLABF16 writes one bfloat16 MLA token entry (latent then rope).
func EncodeMLABF16(dst []byte, latent, rope []float32) {
	for i, v := range latent {
		binary.LittleEndian.PutUint16(dst[2*i:], numeric.Float32ToBF16(v))
	}
	o := 2 * len(latent)
	for i, v := range rope {
		binary.LittleEndian.PutUint16(dst[o+2*i:], numeric.Float32ToBF16(v))
	}
}

// DecodeMLABF16 reads one bfloat16 MLA token entry.
func DecodeMLABF16(latent, rope []float32, src []byte) {
	for i := range latent {
		latent[i] = numeric.BF16ToFloat32(binary.LittleEndian.Uint16(src[2*i:]))
	}
	o := 2 * len(latent)
	for i := range rope {
		rope[i] = numeric.BF16ToFloat32(binary.LittleEndian.Uint16(src[o+2*i:]))
	}
}

// --- indexer pages ---

// UE8M0Ceil returns the smallest power of two >= s (s > 0).
func UE8M0Ceil(s float32) float32 {
	frac, exp := math.Frexp(float64(s)) // s = frac * 2^exp, frac in [0.5,1)
	if frac == 0.5 {
		return s
	}
	return float32(math.Ldexp(1, exp))
}

// EncodeIndexerKey writes token t (0..63) of an indexer page from its key
// (len D): values rounded to bf16, per-128 ue8m0 scale, fp8 e4m3.
func EncodeIndexerKey(page []byte, t int, k []float32) {
	d := len(k)
	ns := d / 128
	var tile [128]float32
	for j := 0; j < ns; j++ {
		var amax float32
		for i := 0; i < 128; i++ {
			v := roundBF16(k[j*128+i])
			tile[i] = v
			amax = max(amax, float32(math.Abs(float64(v))))
		}
		scale := UE8M0Ceil(max(amax, 1e-4) / 448)
		for i := 0; i < 128; i++ {
			page[t*d+j*128+i] = numeric.Float32ToFP8E4M3(tile[i] / scale)
		}
		binary.LittleEndian.PutUint32(page[BlockSize*d+(t*ns+j)*4:], math.Float32bits(scale))
	}
}

// DecodeIndexerKey reads token t of an indexer page into k (len D).
func DecodeIndexerKey(k []float32, page []byte, t int) {
	d := len(k)
	ns := d / 128
	for j := 0; j < ns; j++ {
		scale := math.Float32frombits(binary.LittleEndian.Uint32(page[BlockSize*d+(t*ns+j)*4:]))
		for i := 0; i < 128; i++ {
			k[j*128+i] = numeric.FP8E4M3ToFloat32(page[t*d+j*128+i]) * scale
		}
	}
}

// QuantFP8UE8M0 quantises v in groups of 128 to fp8 with power-of-two scales
// and writes the dequantised values back (vLLM's per_token_group_quant_fp8
// with use_ue8m0, as applied to the indexer query).
func QuantFP8UE8M0(v []float32) {
	for j := 0; j+128 <= len(v); j += 128 {
		var amax float32
		for _, x := range v[j : j+128] {
			amax = max(amax, float32(math.Abs(float64(x))))
		}
		scale := UE8M0Ceil(max(amax, 1e-10) / 448)
		for i := j; i < j+128; i++ {
			v[i] = numeric.FP8E4M3ToFloat32(numeric.Float32ToFP8E4M3(v[i]/scale)) * scale
		}
	}
}

func roundBF16(v float32) float32 { return numeric.BF16ToFloat32(numeric.Float32ToBF16(v)) }
