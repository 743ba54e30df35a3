package prefillshim

import (
	"context"
	"encoding/base64"
	"hash/crc32"
	"sort"
	"sync"
	"time"

	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/handoff"
	"github.com/tilert-go/tilert/pd"
	"github.com/tilert-go/tilert/rdma"
)

// The zero-copy path (docs/PROTOCOL.md section 8, "Zero-copy"): the plugin
// registers vLLM's cache allocations once per connection by CUDA IPC handle,
// then names each request's blocks; the sidecar sends them straight from
// the prefill GPU's memory and, once it no longer reads them, releases them
// so vLLM may reuse the blocks.

// Message types of the zero-copy path.
const (
	TypeRegisterCache = "register_cache" // plugin -> sidecar: IPC handles + layer geometry
	TypeRegistered    = "registered"     // sidecar -> plugin
	TypeStageBlocks   = "stage_blocks"   // plugin -> sidecar: one request by block ids
	TypePoll          = "poll"           // plugin -> sidecar: which requests' blocks are released
	TypeReleased      = "released"       // sidecar -> plugin
)

// DeviceAccess maps and reads another process's GPU memory (gpu.go has the
// CUDA implementation; tests use host memory).
type DeviceAccess interface {
	rdma.DeviceReader
	// Open maps the allocation an IPC handle names; bytes is its size.
	Open(device int, handle []byte, bytes int64) (uintptr, error)
	Close(device int, addr uintptr) error
}

// CacheAlloc is one device allocation holding caches.
type CacheAlloc struct {
	Device int    `json:"device"`
	Handle string `json:"handle"` // base64 of the 64-byte CUipcMemHandle
	Bytes  int64  `json:"bytes"`
}

// CacheLayer is one layer cache inside an allocation: kernel block b starts
// at Offset + b*BlockStride and holds BlockBytes bytes; the decode node's
// page is PageBytes (64 tokens).
type CacheLayer struct {
	Layer       int    `json:"layer"`
	Kind        string `json:"kind"`
	Alloc       int    `json:"alloc"`
	Offset      int64  `json:"offset"`
	BlockStride int64  `json:"block_stride"`
	BlockBytes  int64  `json:"block_bytes"`
	NumBlocks   int    `json:"num_blocks"`
	Group       int    `json:"group"`
	PageBytes   int64  `json:"page_bytes"`
}

// RegisterCache is the plugin's register_cache frame.
type RegisterCache struct {
	Type   string       `json:"type"`
	Allocs []CacheAlloc `json:"allocs"`
	Layers []CacheLayer `json:"layers"`
}

// StageBlocks names one request's state by kernel block ids per KV cache
// group; the other fields are those of a stage frame.
type StageBlocks struct {
	Type            string  `json:"type"`
	Tag             string  `json:"tag"` // the plugin's name for the release (vLLM's request id)
	RID             string  `json:"rid"`
	Host            string  `json:"tilert_host"`
	CtrlPort        int     `json:"tilert_ctrl_port"`
	Model           string  `json:"model"`
	KVCacheDType    string  `json:"kv_cache_dtype"`
	SeqLen          int     `json:"seq_len"`
	MTPLen          int     `json:"mtp_len"`
	LastPromptToken int     `json:"last_prompt_token"`
	PromptTokenIDs  []int   `json:"prompt_token_ids,omitempty"`
	Blocks          [][]int `json:"blocks"`
}

// Released answers a poll: tags whose blocks the sidecar no longer reads.
type Released struct {
	Type     string   `json:"type"`
	Released []string `json:"released"`
}

// mappedCache is one plugin connection's registered caches.
type mappedCache struct {
	s      *Sidecar
	layers []CacheLayer // in layout order
	addrs  []uintptr    // per alloc, in this process
	devs   []int
	ids    []rdma.RegionID // per alloc, registered with the transfer engine

	mu       sync.Mutex
	refs     int // jobs in flight + the connection
	closed   bool
	released []string
}

func (s *Sidecar) registerCache(rc *RegisterCache) (*mappedCache, error) {
	if s.o.Device == nil {
		return nil, errors.New("this sidecar has no GPU access (zero-copy off); stage through /dev/shm")
	}
	if len(rc.Allocs) == 0 || len(rc.Layers) == 0 {
		return nil, errors.New("register_cache: no allocations or no layers")
	}
	m := &mappedCache{s: s, refs: 1}
	fail := func(err error) (*mappedCache, error) {
		m.unmap()
		return nil, err
	}
	for i, a := range rc.Allocs {
		h, err := base64.StdEncoding.DecodeString(a.Handle)
		if err != nil || len(h) != 64 {
			return fail(errors.Newf("allocs[%d]: handle is not 64 base64-encoded bytes", i))
		}
		if a.Bytes <= 0 {
			return fail(errors.Newf("allocs[%d]: %d bytes", i, a.Bytes))
		}
		addr, err := s.o.Device.Open(a.Device, h, a.Bytes)
		if err != nil {
			return fail(errors.Wrapf(err, "allocs[%d]: mapping device %d memory", i, a.Device))
		}
		m.addrs = append(m.addrs, addr)
		m.devs = append(m.devs, a.Device)
		id := rdma.RegionID(s.regionID.Add(1))
		if err := s.o.Transfer.Register(rdma.Region{ID: id, Kind: rdma.DeviceMem, Addr: addr, Len: a.Bytes, Device: a.Device}); err != nil {
			return fail(errors.Wrapf(err, "allocs[%d]: registering with the %s transfer engine", i, s.o.Transfer.Kind()))
		}
		m.ids = append(m.ids, id)
	}
	seen := map[string]bool{}
	for i, l := range rc.Layers {
		name := regionName(StageRegion{Layer: l.Layer, Kind: l.Kind})
		switch {
		case l.Kind != "mla" && l.Kind != "indexer":
			return fail(errors.Newf("layers[%d]: kind %q, want mla or indexer", i, l.Kind))
		case seen[name]:
			return fail(errors.Newf("layers[%d]: %s listed twice", i, name))
		case l.Alloc < 0 || l.Alloc >= len(rc.Allocs):
			return fail(errors.Newf("layers[%d]: alloc %d of %d", i, l.Alloc, len(rc.Allocs)))
		case l.BlockBytes <= 0 || l.PageBytes <= 0 || l.NumBlocks <= 0 || l.BlockStride < l.BlockBytes && l.NumBlocks > 1 || l.Group < 0:
			return fail(errors.Newf("layers[%d] %s: geometry %+v", i, name, l))
		case l.Offset < 0 || l.Offset+int64(l.NumBlocks-1)*l.BlockStride+l.BlockBytes > rc.Allocs[l.Alloc].Bytes:
			return fail(errors.Newf("layers[%d] %s: blocks run past the %d-byte allocation", i, name, rc.Allocs[l.Alloc].Bytes))
		}
		seen[name] = true
	}
	m.layers = append([]CacheLayer(nil), rc.Layers...)
	sort.Slice(m.layers, func(i, j int) bool {
		if m.layers[i].Layer != m.layers[j].Layer {
			return m.layers[i].Layer < m.layers[j].Layer
		}
		return m.layers[i].Kind == "mla" && m.layers[j].Kind != "mla"
	})
	return m, nil
}

func (m *mappedCache) unmap() {
	for _, id := range m.ids {
		_ = m.s.o.Transfer.Deregister(id)
	}
	for i, a := range m.addrs {
		if err := m.s.o.Device.Close(m.devs[i], a); err != nil {
			m.s.o.Log.Warn("sidecar: unmapping vLLM's cache", "err", err)
		}
	}
	m.ids, m.addrs = nil, nil
}

// acquire takes a reference for a job; false once the connection closed.
func (m *mappedCache) acquire() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return false
	}
	m.refs++
	return true
}

func (m *mappedCache) release(tag string) {
	m.mu.Lock()
	if tag != "" {
		m.released = append(m.released, tag)
	}
	m.refs--
	last := m.refs == 0
	m.mu.Unlock()
	if last {
		m.unmap()
	}
}

// closeConn drops the connection's reference: the mapping goes when the
// last job reading it ends.
func (m *mappedCache) closeConn() {
	m.mu.Lock()
	m.closed = true
	m.mu.Unlock()
	m.release("")
}

func (m *mappedCache) takeReleased() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := m.released
	m.released = nil
	if out == nil {
		out = []string{}
	}
	return out
}

// blockJob is one request to send from the mapped cache.
type blockJob struct {
	sb    *StageBlocks
	cache *mappedCache
	plan  []layerPlan
	bytes int64
}

type layerPlan struct {
	l     CacheLayer
	bytes int64 // ceil(seq_len/64) pages
	segs  []rdma.DeviceSeg
}

func (sb *StageBlocks) asStage() *Stage {
	return &Stage{Type: TypeStage, RID: sb.RID, Host: sb.Host, CtrlPort: sb.CtrlPort, Model: sb.Model, KVCacheDType: sb.KVCacheDType,
		SeqLen: sb.SeqLen, MTPLen: sb.MTPLen, LastPromptToken: sb.LastPromptToken, PromptTokenIDs: sb.PromptTokenIDs}
}

// planBlocks validates a stage_blocks frame against the mapped cache and
// turns it into device spans per layer region.
func (m *mappedCache) planBlocks(sb *StageBlocks) (*blockJob, error) {
	st := sb.asStage()
	switch {
	case sb.Tag == "":
		return nil, errors.New("tag: missing")
	case len(sb.Tag) > 256:
		return nil, errors.Newf("tag: %d bytes, at most 256", len(sb.Tag))
	}
	if err := st.validateFields(); err != nil {
		return nil, err
	}
	pages := int64((sb.SeqLen + 63) / 64)
	j := &blockJob{sb: sb, cache: m}
	for _, l := range m.layers {
		name := regionName(StageRegion{Layer: l.Layer, Kind: l.Kind})
		if l.Group >= len(sb.Blocks) {
			return nil, errors.Newf("blocks: no block list for group %d (%s)", l.Group, name)
		}
		ids := sb.Blocks[l.Group]
		n := pages * l.PageBytes
		need := int((n + l.BlockBytes - 1) / l.BlockBytes)
		if len(ids) < need {
			return nil, errors.Newf("blocks[%d]: %d blocks for %s, %d tokens need %d", l.Group, len(ids), name, sb.SeqLen, need)
		}
		p := layerPlan{l: l, bytes: n}
		base := m.addrs[l.Alloc] + uintptr(l.Offset)
		left := n
		for _, b := range ids[:need] {
			if b < 0 || b >= l.NumBlocks {
				return nil, errors.Newf("blocks[%d]: block %d outside %s's %d blocks", l.Group, b, name, l.NumBlocks)
			}
			k := min(left, l.BlockBytes)
			p.segs = append(p.segs, rdma.DeviceSeg{Addr: base + uintptr(int64(b)*l.BlockStride), Len: k})
			left -= k
		}
		j.plan = append(j.plan, p)
		j.bytes += n
	}
	return j, nil
}

// enqueueBlocks validates and queues a stage_blocks frame.
func (s *Sidecar) enqueueBlocks(m *mappedCache, sb *StageBlocks) Reply {
	st := sb.asStage()
	refuse := func(code, outcome string, err error) Reply {
		s.m.frames.With(code).Inc()
		s.finish(st, outcome, err, time.Time{})
		return Reply{Type: TypeError, RID: sb.RID, Error: code, Message: err.Error()}
	}
	if m == nil {
		return refuse(ErrCodeBadRequest, OutcomeBadRequest, errors.New("stage_blocks before register_cache on this connection"))
	}
	j, err := m.planBlocks(sb)
	if err != nil {
		return refuse(ErrCodeBadRequest, OutcomeBadRequest, err)
	}
	st.FileBytes = j.bytes
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closing {
		return refuse(ErrCodeShuttingDown, OutcomeShuttingDown, errors.New("the sidecar is shutting down"))
	}
	if !m.acquire() {
		return refuse(ErrCodeShuttingDown, OutcomeShuttingDown, errors.New("the cache registration is closed"))
	}
	select {
	case s.queue <- &job{st: st, blocks: j, received: time.Now()}:
	default:
		m.release(sb.Tag)
		return refuse(ErrCodeStagingFull, OutcomeQueueFull, errors.Newf("%d requests already queued", cap(s.queue)))
	}
	return Reply{Type: TypeQueued, RID: sb.RID, QueueDepth: len(s.queue)}
}

// shipBlocks sends one request from the mapped cache: admit, the writes
// straight from device memory, done with the CRC of the same bytes.
func (s *Sidecar) shipBlocks(j *blockJob) (string, error) {
	st := j.sb.asStage()
	admit := &pd.Admit{RID: st.RID, Model: st.Model, LayoutVersion: handoff.LayoutVersion, KVCacheDType: st.KVCacheDType,
		NumLayers: j.numLayers(), SeqLen: st.SeqLen, MTPLen: &st.MTPLen, LastPromptToken: st.LastPromptToken, PromptTokenIDs: st.PromptTokenIDs}
	for _, p := range j.plan {
		admit.Regions = append(admit.Regions, pd.RegionSize{Name: regionName(StageRegion{Layer: p.l.Layer, Kind: p.l.Kind}), Bytes: p.bytes})
	}
	// The checksum needs the bytes; read them once more through pinned
	// memory while the transfer runs (DtoH is far faster than the wire).
	type sum struct {
		crc uint32
		err error
	}
	crcC := make(chan sum, 1)
	start := time.Now()
	var crcTook time.Duration
	go func() {
		c, err := j.checksum(s.o.Device)
		crcTook = time.Since(start)
		crcC <- sum{c, err}
	}()
	var crc *sum
	getCRC := func() sum {
		if crc == nil {
			v := <-crcC
			crc = &v
		}
		return *crc
	}
	defer getCRC() // never leave the reader running past the release
	return s.sendAttempts(st, admit, func(ctx context.Context, c *pd.Client, acc *pd.Accept) error {
		ops := make([]rdma.WriteOp, 0, 64)
		for i, p := range j.plan {
			d := acc.Regions[i]
			off := d.Offset
			id := j.cache.ids[p.l.Alloc]
			base := j.cache.addrs[p.l.Alloc]
			for _, sg := range p.segs {
				ops = append(ops, rdma.WriteOp{Local: id, LocalOff: int64(sg.Addr - base), Remote: d.Remote, RemoteOff: off, Len: sg.Len})
				off += sg.Len
			}
		}
		// In source order: neighbouring spans (a block-outermost layout
		// keeps one block's layers together; consecutive block ids) become
		// one device read.
		sort.SliceStable(ops, func(a, b int) bool {
			if ops[a].Local != ops[b].Local {
				return ops[a].Local < ops[b].Local
			}
			return ops[a].LocalOff < ops[b].LocalOff
		})
		w0 := time.Now()
		if err := c.WriteOps(ctx, acc, ops); err != nil {
			return err
		}
		wrote := time.Since(w0)
		v := getCRC()
		s.o.Log.Debug("sidecar: zero-copy writes", "rid", st.RID, "ops", len(ops), "write", wrote, "checksum_read", crcTook)
		if v.err != nil {
			return v.err
		}
		_, err := c.Done(ctx, acc, j.bytes, v.crc)
		return err
	})
}

func (j *blockJob) numLayers() int {
	seen := map[int]bool{}
	for _, p := range j.plan {
		seen[p.l.Layer] = true
	}
	return len(seen)
}

// checksum is the done CRC-32C of the request's bytes in admit order.
func (j *blockJob) checksum(dev DeviceAccess) (uint32, error) {
	const chunk = 8 << 20
	buf, err := dev.HostBuffer(chunk)
	if err != nil {
		return 0, err
	}
	defer func() { _ = dev.FreeHostBuffer(buf) }()
	var crc uint32
	var segs []rdma.DeviceSeg
	n := int64(0)
	device := -1
	flush := func() error {
		if n == 0 {
			return nil
		}
		if err := dev.Gather(device, buf[:n], segs); err != nil {
			return err
		}
		crc = crc32.Update(crc, pd.Castagnoli, buf[:n])
		segs, n = segs[:0], 0
		return nil
	}
	for _, p := range j.plan {
		d := j.cache.devs[p.l.Alloc]
		for _, sg := range p.segs {
			for o := int64(0); o < sg.Len; {
				if d != device || n == chunk {
					if err := flush(); err != nil {
						return 0, err
					}
					device = d
				}
				k := min(sg.Len-o, chunk-n)
				segs = append(segs, rdma.DeviceSeg{Addr: sg.Addr + uintptr(o), Len: k})
				n += k
				o += k
			}
		}
	}
	if err := flush(); err != nil {
		return 0, err
	}
	return crc, nil
}
