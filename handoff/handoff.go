// Package handoff binds an engine's slot state to the ctrl protocol (pd):
// the name and layout a node announces, each cache region's wire name and
// size, the receive regions carved out of the engine's slot buffers, and a
// request's exported state packed for sending. The decode node, the
// connector sidecar and the dev tools all speak it through this package.
package handoff

import (
	"fmt"

	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/engine"
	"github.com/tilert-go/tilert/model"
	"github.com/tilert-go/tilert/pd"
	"github.com/tilert-go/tilert/rdma"
)

// LayoutVersion is the ctrl protocol's layout_version for
// engine.LayoutVersion ("vllm-mla-dsa-v1"); the protocol carries an int.
const LayoutVersion = 1

// ModelName is the name a node announces for a family (hello, admit,
// /capabilities), the launch post's spelling.
func ModelName(f model.Family) string {
	switch f {
	case model.GLMMoEDSA:
		return "glm5"
	case model.DeepSeekV32:
		return "deepseek-v3.2"
	}
	return string(f)
}

// Layout is the ctrl-protocol layout of an engine's state.
func Layout(modelName string, l engine.Layout) pd.Layout {
	return pd.Layout{Model: modelName, LayoutVersion: LayoutVersion, KVCacheDType: string(l.MLACache), NumLayers: l.NumLayers}
}

// RegionName names one layer's cache region on the wire: "L<layer>.<kind>",
// e.g. "L0.mla", "L3.indexer" (the MTP layer is the last layer). Every
// layer region is its own receive region, so a sender writes each one's used
// pages contiguously from offset 0 whatever max_seq_len either side has.
func RegionName(layer int, kind string) string { return fmt.Sprintf("L%d.%s", layer, kind) }

// RegionSizes is what a state of seqLen positions occupies per region:
// whole 64-token pages, the same count in every region.
func RegionSizes(l engine.Layout, seqLen int) []pd.RegionSize {
	pages := (seqLen + engine.BlockSize - 1) / engine.BlockSize
	out := make([]pd.RegionSize, len(l.Regions))
	for i, r := range l.Regions {
		out[i] = pd.RegionSize{Name: RegionName(r.Layer, string(r.Kind)), Bytes: int64(pages) * int64(r.PageBytes)}
	}
	return out
}

// CheckSizes is the table's CheckSizes for layout l: the admit must list
// every region, in layout order, with exactly the pages seq_len needs.
func CheckSizes(l engine.Layout) func(int, []pd.RegionSize) error {
	return func(seqLen int, got []pd.RegionSize) error {
		want := RegionSizes(l, seqLen)
		if len(got) != len(want) {
			return errors.Newf("%d regions, the layout has %d", len(got), len(want))
		}
		for i := range want {
			if got[i].Name != want[i].Name {
				return errors.Newf("region %d is %q, the layout has %q there", i, got[i].Name, want[i].Name)
			}
			if got[i].Bytes != want[i].Bytes {
				return errors.Newf("region %q: %d bytes, seq_len %d needs %d", got[i].Name, got[i].Bytes, seqLen, want[i].Bytes)
			}
		}
		return nil
	}
}

// SlotRegions carves each slot buffer into its layer regions (views of the
// engine's live cache: the transfer engine writes straight into it).
// Region ids are 1 + slot*len(regions) + index.
func SlotRegions(e engine.Engine) ([][]pd.SlotRegion, error) {
	l := e.Layout()
	n := e.Options().Slots
	out := make([][]pd.SlotRegion, n)
	for s := 0; s < n; s++ {
		buf, err := e.SlotBuffer(s)
		if err != nil {
			return nil, err
		}
		if int64(len(buf)) < l.SlotBytes {
			return nil, errors.Newf("slot %d buffer is %d bytes, the layout needs %d", s, len(buf), l.SlotBytes)
		}
		for j, r := range l.Regions {
			size := int64(l.MaxPages) * int64(r.PageBytes)
			out[s] = append(out[s], pd.SlotRegion{Name: RegionName(r.Layer, string(r.Kind)), Region: rdma.Region{
				ID:   rdma.RegionID(1 + s*len(l.Regions) + j),
				Kind: rdma.HostMem,
				Host: buf[r.Offset : r.Offset+size : r.Offset+size],
			}})
		}
	}
	return out, nil
}

// Outgoing is one request's state packed for sending: Buf holds the used
// pages of every region back to back (register it with the sender's
// transfer engine as region ID), Admit lists the sizes, Sources point into
// Buf. The connector sidecar and the tests build it from an engine Export.
type Outgoing struct {
	ID      rdma.RegionID
	Buf     []byte
	Admit   *pd.Admit
	Sources []pd.Source
}

// Pack packs an engine Export (segments in layout order) of layout l as
// request rid, to be registered as region id.
func Pack(rid string, id rdma.RegionID, l engine.Layout, meta engine.SlotMeta, segs []engine.Segment) (*Outgoing, error) {
	if len(segs) != len(l.Regions) {
		return nil, errors.Newf("%d segments for %d layout regions", len(segs), len(l.Regions))
	}
	sizes := RegionSizes(l, meta.SeqLen)
	var total int64
	for i, sg := range segs {
		if sg.Offset != l.Regions[i].Offset || int64(len(sg.Data)) != sizes[i].Bytes {
			return nil, errors.Newf("segment %d at %d with %d bytes; region %s is at %d and seq_len %d needs %d bytes",
				i, sg.Offset, len(sg.Data), sizes[i].Name, l.Regions[i].Offset, meta.SeqLen, sizes[i].Bytes)
		}
		total += sizes[i].Bytes
	}
	mtpLen := meta.MTPLen
	o := &Outgoing{ID: id, Buf: make([]byte, total),
		Admit: &pd.Admit{RID: rid, SeqLen: meta.SeqLen, MTPLen: &mtpLen, LastPromptToken: meta.LastToken, Regions: sizes}}
	var off int64
	for i, sg := range segs {
		copy(o.Buf[off:], sg.Data)
		o.Sources = append(o.Sources, pd.Source{Name: sizes[i].Name, Region: id, Offset: off, Host: o.Buf[off : off+sizes[i].Bytes]})
		off += sizes[i].Bytes
	}
	return o, nil
}

// Region is Buf as a transfer-engine region.
func (o *Outgoing) Region() rdma.Region {
	return rdma.Region{ID: o.ID, Kind: rdma.HostMem, Host: o.Buf}
}
