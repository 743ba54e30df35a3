package prefillshim

import (
	"encoding/base64"
	"encoding/binary"
	"math/rand/v2"
	"net"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/engine"
	"github.com/tilert-go/tilert/rdma"
)

// hostDevice is a DeviceAccess over host memory: an "IPC handle" names one
// of its buffers (8-byte index), addresses are the buffers' own. It checks
// the sidecar's zero-copy logic in CI; the H200 run checks real CUDA IPC.
type hostDevice struct {
	mu     sync.Mutex
	bufs   [][]byte
	open   map[uintptr]bool
	reads  int
	closed int
}

func (h *hostDevice) add(b []byte) []byte {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.bufs = append(h.bufs, b)
	var hd [64]byte
	binary.LittleEndian.PutUint64(hd[:], uint64(len(h.bufs)-1))
	copy(hd[8:], "tilert-test-handle")
	return hd[:]
}

func (h *hostDevice) Open(device int, handle []byte, n int64) (uintptr, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	i := int(binary.LittleEndian.Uint64(handle))
	if i >= len(h.bufs) || string(handle[8:26]) != "tilert-test-handle" || int64(len(h.bufs[i])) < n {
		return 0, errors.New("test: unknown handle")
	}
	p := uintptr(unsafe.Pointer(&h.bufs[i][0]))
	if h.open == nil {
		h.open = map[uintptr]bool{}
	}
	h.open[p] = true
	return p, nil
}

func (h *hostDevice) Close(device int, addr uintptr) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.open[addr] {
		return errors.New("test: closing an address never opened")
	}
	delete(h.open, addr)
	h.closed++
	return nil
}

func (h *hostDevice) HostBuffer(n int) ([]byte, error) { return make([]byte, n), nil }
func (h *hostDevice) FreeHostBuffer([]byte) error      { return nil }

func (h *hostDevice) Gather(device int, dst []byte, segs []rdma.DeviceSeg) error {
	h.mu.Lock()
	h.reads++
	h.mu.Unlock()
	at := int64(0)
	for _, s := range segs {
		var src []byte
		for _, b := range h.bufs {
			base := uintptr(unsafe.Pointer(&b[0]))
			if s.Addr >= base && int64(s.Addr-base)+s.Len <= int64(len(b)) {
				src = b[s.Addr-base : int64(s.Addr-base)+s.Len]
			}
		}
		if src == nil {
			return errors.Newf("test: read of %#x+%d outside every buffer", s.Addr, s.Len)
		}
		at += int64(copy(dst[at:], src))
	}
	if at != int64(len(dst)) {
		return errors.Newf("test: %d of %d bytes", at, len(dst))
	}
	return nil
}

// vllmCache lays out the engine's exported regions the way vLLM 0.33's
// allocate_kv_cache does: one buffer, per layer a [blocks, 64, C] view,
// block-outermost (BLNHC: a block holds every layer's page) or
// layer-outermost (LBNHC), stale bytes everywhere, the request's pages
// written into blockIDs.
func vllmCache(t *testing.T, pf *prefilled, blockOuter bool, numBlocks int, blockIDs []int, rng *rand.Rand) ([]byte, []CacheLayer) {
	t.Helper()
	type lr struct {
		r    engine.Region
		page int64
		data []byte
	}
	var regs []lr
	var perBlock int64
	for i, sg := range pf.segs {
		r := pf.layout.Regions[i]
		page := int64(engine.BlockSize * pf.layout.MLATokenBytes)
		if r.Kind != engine.RegionMLA {
			page = int64(pf.layout.IndexerPageBytes)
		}
		regs = append(regs, lr{r, page, sg.Data})
		perBlock += page
	}
	buf := make([]byte, perBlock*int64(numBlocks)+4096)
	for i := range buf {
		buf[i] = byte(rng.Uint32())
	}
	var layers []CacheLayer
	off := int64(512) // the views start inside the allocation, as torch's storage offset can
	for _, x := range regs {
		l := CacheLayer{Layer: x.r.Layer, Kind: string(x.r.Kind), Offset: off, BlockBytes: x.page, NumBlocks: numBlocks, PageBytes: x.page}
		if blockOuter {
			l.BlockStride = perBlock
			off += x.page
		} else {
			l.BlockStride = x.page
			off += x.page * int64(numBlocks)
		}
		for p := int64(0); p*x.page < int64(len(x.data)); p++ {
			dst := l.Offset + int64(blockIDs[p])*l.BlockStride
			copy(buf[dst:dst+x.page], x.data[p*x.page:(p+1)*x.page])
		}
		layers = append(layers, l)
	}
	return buf, layers
}

func TestZeroCopyBlocksToDecodeNode(t *testing.T) {
	prompt := make([]int, 150)
	for i := range prompt {
		prompt[i] = (i*37 + 11) % 1000
	}
	const maxTokens = 12
	pf := prefill(t, prompt, maxTokens)
	for _, blockOuter := range []bool{true, false} {
		name := map[bool]string{true: "BLNHC", false: "LBNHC"}[blockOuter]
		t.Run(name, func(t *testing.T) {
			a := node(t, 1)
			dev := &hostDevice{}
			tr, err := rdma.NewTCP(rdma.TCPConfig{DeviceReader: dev, DeviceStagingBytes: 100_000})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = tr.Close() })
			h := newHarness(t, Options{Transfer: tr, Device: dev})
			rng := rand.New(rand.NewPCG(5, 9))
			blocks := []int{17, 4, 9} // 150 tokens: three 64-token pages, scattered
			buf, layers := vllmCache(t, pf, blockOuter, 24, blocks, rng)
			handle := dev.add(buf)

			p := h.dialPlugin(t)
			if hello := p.roundTrip(map[string]any{"type": "hello"}); hello["ipc"] != true {
				t.Fatalf("hello %v does not offer ipc though the sidecar has device access", hello)
			}
			// Blocks before any registration are refused, the connection stays.
			host, port, _ := net.SplitHostPort(a.Ctrl)
			pn, _ := strconv.Atoi(port)
			sb := map[string]any{"type": TypeStageBlocks, "tag": "req-1-abcdefgh", "rid": "zc-" + name, "tilert_host": host,
				"tilert_ctrl_port": pn, "model": "glm5", "kv_cache_dtype": string(pf.layout.MLACache), "seq_len": pf.meta.SeqLen,
				"mtp_len": pf.meta.MTPLen, "last_prompt_token": pf.meta.LastToken, "blocks": [][]int{blocks}}
			if r := p.roundTrip(sb); r["error"] != ErrCodeBadRequest {
				t.Fatalf("stage_blocks before register_cache: %v", r)
			}
			bad := []CacheLayer{layers[0]}
			bad[0].NumBlocks = 1 << 20
			if r := p.roundTrip(RegisterCache{Type: TypeRegisterCache, Allocs: []CacheAlloc{{Handle: base64.StdEncoding.EncodeToString(handle), Bytes: int64(len(buf))}}, Layers: bad}); r["error"] != ErrCodeBadRequest {
				t.Fatalf("a layer running past its allocation was registered: %v", r)
			}
			reg := RegisterCache{Type: TypeRegisterCache, Allocs: []CacheAlloc{{Handle: base64.StdEncoding.EncodeToString(handle), Bytes: int64(len(buf))}}, Layers: layers}
			dev.mu.Lock()
			unmapped := dev.closed // the refused registration's mapping is gone already
			dev.mu.Unlock()
			if unmapped != 1 {
				t.Fatalf("the refused registration left %d mappings open", 1-unmapped)
			}
			if r := p.roundTrip(reg); r["type"] != TypeRegistered {
				t.Fatalf("register_cache: %v\n%s", r, h.logs())
			}
			// A block outside the cache is refused before anything is sent.
			sbBad := map[string]any{}
			for k, v := range sb {
				sbBad[k] = v
			}
			sbBad["blocks"] = [][]int{{17, 4, 99}}
			if r := p.roundTrip(sbBad); r["error"] != ErrCodeBadRequest {
				t.Fatalf("block 99 of 24: %v", r)
			}
			if r := p.roundTrip(sb); r["type"] != TypeQueued {
				t.Fatalf("stage_blocks: %v\n%s", r, h.logs())
			}
			got, done := decodeStreamDone(t, a.HTTP, "zc-"+name, pf.first, maxTokens)
			if !slices.Equal(got, pf.want) || done.Finish != "length" {
				t.Fatalf("node decoded %v, the engine %v\n%s", got, pf.want, h.logs())
			}
			if want := float64(pf.stats.AcceptedTokens) / float64(pf.stats.DraftTokens); done.MTPAcceptMean != want {
				t.Fatalf("MTP acceptance %v, the engine's %v: the MTP layer's bytes differ", done.MTPAcceptMean, want)
			}
			// The blocks are released once the sidecar stopped reading them.
			deadline := time.Now().Add(60 * time.Second)
			var released []any
			for len(released) == 0 && time.Now().Before(deadline) {
				r := p.roundTrip(map[string]any{"type": TypePoll})
				released, _ = r["released"].([]any)
				if len(released) == 0 {
					time.Sleep(5 * time.Millisecond)
				}
			}
			if len(released) != 1 || released[0] != "req-1-abcdefgh" {
				t.Fatalf("released %v, want [req-1-abcdefgh]", released)
			}
			if r := p.roundTrip(map[string]any{"type": TypePoll}); len(r["released"].([]any)) != 0 {
				t.Fatalf("a tag was released twice: %v", r)
			}
			h.waitOutcome(t, OutcomeOK, 1)
			if dev.reads == 0 {
				t.Fatal("no device reads: the bytes did not come from the mapped cache")
			}
			// Closing the plugin's connection unmaps the cache.
			p.conn.Close()
			for i := 0; ; i++ {
				dev.mu.Lock()
				n := dev.closed
				dev.mu.Unlock()
				if n == unmapped+1 {
					break
				}
				if i > 12000 {
					t.Fatal("the mapping outlived the plugin's connection")
				}
				time.Sleep(5 * time.Millisecond)
			}
		})
	}
}

// A sidecar without GPU access says so in hello and refuses registrations.
func TestZeroCopyOffWithoutDevice(t *testing.T) {
	h := newHarness(t, Options{})
	p := h.dialPlugin(t)
	if hello := p.roundTrip(map[string]any{"type": "hello"}); hello["ipc"] != nil {
		t.Fatalf("hello %v offers ipc without device access", hello)
	}
	r := p.roundTrip(RegisterCache{Type: TypeRegisterCache, Allocs: []CacheAlloc{{Handle: base64.StdEncoding.EncodeToString(make([]byte, 64)), Bytes: 1}},
		Layers: []CacheLayer{{Kind: "mla", BlockBytes: 1, PageBytes: 1, NumBlocks: 1}}})
	if r["error"] != ErrCodeBadRequest {
		t.Fatalf("register_cache without device access: %v", r)
	}
	if r := p.roundTrip(map[string]any{"type": TypePoll}); r["type"] != TypeReleased {
		t.Fatalf("poll: %v", r)
	}
}
