package converter

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"strconv"

	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/weights"
)

// shardPlan is one output file: its tensors in data order and its encoded header.
type shardPlan struct {
	file    string
	device  int
	tensors []int // indices into the plan's tensors
	header  []byte
	bytes   int64 // whole file
}

// headerReserve is an upper bound of a tensor's share of the header (its JSON entry) beyond its
// name, used to keep header + data within the shard limit before the header is encoded.
const headerReserve = 128

// assignShards cuts the tensors (already in stored order) into shards of at most limit bytes,
// starting a new shard whenever the device changes, so a device's experts never share a file with
// another device's. It fills in each entry's Shard and Offset.
func assignShards(ts []outTensor, limit int64) ([]shardPlan, error) {
	var shards []shardPlan
	var cur *shardPlan
	var curBytes int64
	for i := range ts {
		t := &ts[i]
		need := t.Bytes + int64(len(t.Name)) + headerReserve
		if need+256 > limit {
			return nil, errors.WithHint(errors.Newf("tensor %q holds %d bytes, more than the %d byte shard limit", t.Name, t.Bytes, limit),
				"expert stacks shrink with more devices: raise --devices")
		}
		if cur == nil || cur.device != t.Device || curBytes+need > limit {
			shards = append(shards, shardPlan{device: t.Device})
			cur = &shards[len(shards)-1]
			curBytes = 256 // the 8-byte length, braces, metadata
		}
		cur.tensors = append(cur.tensors, i)
		curBytes += need
	}
	for k := range shards {
		s := &shards[k]
		s.file = fmt.Sprintf("model-%05d-of-%05d.safetensors", k+1, len(shards))
		s.header = encodeHeader(ts, s.tensors)
		pos := int64(len(s.header))
		for _, i := range s.tensors {
			ts[i].Shard, ts[i].Offset = s.file, pos
			pos += ts[i].Bytes
		}
		s.bytes = pos
		if pos > limit {
			return nil, errors.AssertionFailedf("shard %s: %d bytes over the %d limit", s.file, pos, limit)
		}
	}
	return shards, nil
}

// encodeHeader writes a safetensors header (8-byte little-endian length, JSON, space padding to an
// 8-byte boundary) for the given tensors, contiguous in the given order.
func encodeHeader(ts []outTensor, idx []int) []byte {
	var b bytes.Buffer
	b.Write(make([]byte, 8))
	b.WriteString(`{"__metadata__":{"format":"tilert","tilert_layout_version":"` + strconv.Itoa(weights.LayoutVersion) + `"}`)
	var pos int64
	for _, i := range idx {
		t := &ts[i]
		name, _ := json.Marshal(t.Name)
		b.WriteByte(',')
		b.Write(name)
		b.WriteString(`:{"dtype":"` + t.DType + `","shape":[`)
		for k, d := range t.Shape {
			if k > 0 {
				b.WriteByte(',')
			}
			b.WriteString(strconv.FormatInt(d, 10))
		}
		fmt.Fprintf(&b, `],"data_offsets":[%d,%d]}`, pos, pos+t.Bytes)
		pos += t.Bytes
	}
	b.WriteByte('}')
	for b.Len()%8 != 0 {
		b.WriteByte(' ')
	}
	out := b.Bytes()
	binary.LittleEndian.PutUint64(out, uint64(len(out)-8))
	return out
}
