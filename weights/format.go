// Package weights is the TileRT weight format: a manifest plus safetensors shards laid out for the
// decode kernels. It defines the format (this file: tensor names, kinds, the manifest schema), the
// plan of stored tensors a config implies (plan.go), the reader (reader.go) and the verifier
// (verify.go). The converter that writes it is package convert; loaders import only this one.
//
// The layouts are described in docs/LAYOUTS.md ("Weights").
package weights

import (
	"encoding/json"
	"fmt"
	"hash/crc32"
	"strings"

	"github.com/tilert-go/tilert/model"
)

// Castagnoli is the CRC-32C table of the per-tensor checksums.
var Castagnoli = crc32.MakeTable(crc32.Castagnoli)

// CRCHex is a checksum as the manifest writes it: 8 lower-case hex digits.
func CRCHex(c uint32) string { return fmt.Sprintf("%08x", c) }

const (
	// FormatName identifies a TileRT weights manifest.
	FormatName = "tilert-weights"
	// LayoutVersion is bumped whenever a tensor name, layout or the manifest schema changes in a way
	// an older loader would misread. Loaders refuse any other version.
	LayoutVersion = 1
	// ManifestFile is written last: a directory without it is not a TileRT weights directory.
	ManifestFile = "tilert_manifest.json"
	// PartialSuffix marks a conversion in progress (or interrupted); loaders refuse such a directory.
	PartialSuffix = ".partial"
	// DefaultMaxShardBytes is the shard size limit (header included), as HF's 5 GB.
	DefaultMaxShardBytes = 5_000_000_000
	// ChecksumAlgo is the per-tensor checksum: CRC-32C (Castagnoli) of the tensor's bytes.
	ChecksumAlgo = "crc32c"
	// ExpertPlacement names how routed experts are spread over devices (see DeviceOfExpert).
	ExpertPlacement = "contiguous"
)

// Kind says how a stored tensor's bytes are to be read. Every kind is described in docs/LAYOUTS.md.
type Kind string

const (
	// KindPlain: row-major tensor of the given shape and dtype, bytes as in the HF checkpoint.
	KindPlain Kind = "plain"
	// KindFP8Block: [rows, cols] e4m3 weight; its scale tensor (Scale) is a KindBlockScale.
	KindFP8Block Kind = "fp8_block"
	// KindBlockScale: float32 [ceil(rows/128), ceil(cols/128)] (or [n, ...] stacked) block scales:
	// W[i,j] = fp8(w[i,j]) * s[i/128][j/128].
	KindBlockScale Kind = "block_scale"
	// KindAbsorbed: per-head [heads, rows, kv_lora_rank] slice of kv_b_proj (W_UK or W_UV), e4m3
	// with a KindRowScale, or bf16/f16/f32 when the checkpoint is not quantised.
	KindAbsorbed Kind = "absorbed"
	// KindRowScale: float32 [heads, rows, ceil(kv_lora_rank/128)]: W[h,r,c] = fp8(w[h,r,c]) * s[h,r,c/128].
	KindRowScale Kind = "row_scale"
	// KindExperts: [n_local, rows, cols] stack of one projection of a device's routed experts.
	KindExperts Kind = "experts"
)

// Entry describes one stored tensor in the manifest.
type Entry struct {
	Name   string  `json:"name"`
	Kind   Kind    `json:"kind"`
	Shard  string  `json:"shard"`
	Offset int64   `json:"offset"` // absolute byte offset in the shard file
	Bytes  int64   `json:"bytes"`
	Shape  []int64 `json:"shape"`
	DType  string  `json:"dtype"`
	CRC32C string  `json:"crc32c"` // 8 lower-case hex digits
	// Device is the device index whose kernels read this tensor, -1 for tensors every device needs.
	Device int `json:"device"`
	// Scale names the tensor holding this weight's scales ("" when unquantised or itself a scale).
	Scale string `json:"scale,omitempty"`
}

// ShardInfo is one safetensors file of the output.
type ShardInfo struct {
	File    string `json:"file"`
	Bytes   int64  `json:"bytes"`
	Device  int    `json:"device"` // -1: shared tensors; d: only device d's experts
	Tensors int    `json:"tensors"`
}

// FileInfo is a non-weight file copied from the checkpoint (config, tokenizer).
type FileInfo struct {
	Name   string `json:"name"`
	Bytes  int64  `json:"bytes"`
	CRC32C string `json:"crc32c"`
}

// Quant records the source quantisation that the fp8 tensors keep.
type Quant struct {
	Fmt       string `json:"fmt"`        // "e4m3"
	BlockSize [2]int `json:"block_size"` // [128, 128]
	ScaleFmt  string `json:"scale_fmt,omitempty"`
}

// Manifest is the content of tilert_manifest.json.
type Manifest struct {
	Format           string          `json:"format"`
	LayoutVersion    int             `json:"layout_version"`
	ConverterVersion string          `json:"converter_version"`
	ModelType        model.Family    `json:"model_type"`
	ModelName        string          `json:"model_name,omitempty"` // as given to --model
	HFConfig         json.RawMessage `json:"hf_config"`
	Devices          int             `json:"devices"`
	ExpertPlacement  string          `json:"expert_placement"`
	// MTPLayers is the number of MTP layers stored (0 when converted with --append-mtp=false).
	MTPLayers    int         `json:"mtp_layers"`
	Quantization *Quant      `json:"quantization"`
	Checksum     string      `json:"checksum"`
	TotalBytes   int64       `json:"total_bytes"` // tensor bytes over all shards
	Shards       []ShardInfo `json:"shards"`
	Files        []FileInfo  `json:"files"`
	Tensors      []Entry     `json:"tensors"`
}

// ScaleNameOf names the float32 scale tensor of a stored fp8 tensor ("x.weight" -> "x.weight_scale").
// The values are HF's weight_scale_inv: they multiply the fp8 values.
func ScaleNameOf(weight string) string { return weight + "_scale" }

// AbsorbedNames are the stored names of layer i's absorbed MLA matrices, which replace kv_b_proj.
func AbsorbedNames(i int) (wUK, wUV string) {
	p := fmt.Sprintf("model.layers.%d.self_attn.", i)
	return p + "w_uk.weight", p + "w_uv.weight"
}

// ExpertStackName is the stored name of device d's stack of projection proj ("gate_proj",
// "up_proj" or "down_proj") of layer i's routed experts.
func ExpertStackName(i, d int, proj string) string {
	return fmt.Sprintf("model.layers.%d.mlp.experts.dev%d.%s.weight", i, d, proj)
}

// ExpertProjs are the three projections of a routed expert, in stored order.
var ExpertProjs = [3]string{"gate_proj", "up_proj", "down_proj"}

// FirstExpert is the first routed expert on device d of devices (contiguous placement: expert e
// lives on device floor(e*devices/n)).
func FirstExpert(d, devices, n int) int { return (d*n + devices - 1) / devices }

// DeviceOfExpert is the device holding routed expert e, and e's index in that device's stacks.
func DeviceOfExpert(e, devices, n int) (dev, local int) {
	dev = e * devices / n
	return dev, e - FirstExpert(dev, devices, n)
}

// ParseExpertName splits "model.layers.{i}.mlp.experts.{e}.{proj}.weight".
func ParseExpertName(name string) (layer, expert int, proj string, ok bool) {
	var rest string
	n, err := fmt.Sscanf(name, "model.layers.%d.mlp.experts.%d.%s", &layer, &expert, &rest)
	if err != nil || n != 3 {
		return 0, 0, "", false
	}
	proj, found := strings.CutSuffix(rest, ".weight")
	if !found {
		return 0, 0, "", false
	}
	for _, p := range ExpertProjs {
		if p == proj && name == fmt.Sprintf("model.layers.%d.mlp.experts.%d.%s.weight", layer, expert, proj) {
			return layer, expert, proj, true
		}
	}
	return 0, 0, "", false
}

// IsKVBProj reports whether name is a layer's kv_b_proj weight, and which layer.
func IsKVBProj(name string) (layer int, ok bool) {
	n, err := fmt.Sscanf(name, "model.layers.%d.self_attn.kv_b_proj.weight", &layer)
	return layer, err == nil && n == 1 && name == model.Layer(layer).KVBProj
}
