package decode

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/api/decodeapi"
	"github.com/tilert-go/tilert/cuda"
	"github.com/tilert-go/tilert/engine"
	"github.com/tilert-go/tilert/engine/cpu"
	"github.com/tilert-go/tilert/engine/gpu"
	"github.com/tilert-go/tilert/handoff"
	"github.com/tilert-go/tilert/model"
	"github.com/tilert-go/tilert/model/synth"
	"github.com/tilert-go/tilert/pd"
	"github.com/tilert-go/tilert/rdma"
	"github.com/tilert-go/tilert/rdma/nixl"
)

var testRoot = func() string {
	d, err := os.MkdirTemp("", "tilert-decode-test-")
	if err != nil {
		panic(err)
	}
	return d
}()

func TestMain(m *testing.M) {
	code := m.Run()
	os.RemoveAll(testRoot)
	os.Exit(code)
}

var (
	presetMu   sync.Mutex
	presetDirs = map[string]string{}
	models     = map[string]loadedModel{}
)

type loadedModel struct {
	cfg *model.Config
	w   model.Weights
}

// presetDir writes a synthetic tiny checkpoint once per test run.
func presetDir(t testing.TB, name string) string {
	t.Helper()
	presetMu.Lock()
	defer presetMu.Unlock()
	if d, ok := presetDirs[name]; ok {
		return d
	}
	dir := filepath.Join(testRoot, name)
	if err := synth.Write(name, dir, 0, nil); err != nil {
		t.Fatalf("synth %s: %v", name, err)
	}
	presetDirs[name] = dir
	return dir
}

func loadModel(t testing.TB, name string) loadedModel {
	t.Helper()
	dir := presetDir(t, name)
	presetMu.Lock()
	defer presetMu.Unlock()
	if m, ok := models[name]; ok {
		return m
	}
	cfg, err := model.LoadConfig(dir)
	if err != nil {
		t.Fatal(err)
	}
	w, err := model.OpenWeights(dir)
	if err != nil {
		t.Fatal(err)
	}
	models[name] = loadedModel{cfg: cfg, w: w}
	return models[name]
}

const testMaxSeq = 512

type rigOpts struct {
	preset    string
	slots     int
	mtp       bool
	transport string // tcp (default) | nixl
	kv        engine.CacheDType
	reserve   time.Duration
	minBatch  int
	stepHook  func()
	maxSeq    int    // default testMaxSeq
	device    string // cpu (default) | cuda | emu-tp4 | cuda-tp4 (tensor-parallel, 4 ranks on one device)
	sec       Security
}

// buildEngine builds an engine on device (cpu, cuda, or emu-tpN / cuda-tpN:
// the tensor-parallel engine with N ranks on the emulator or on GPU 0); the
// caller closes it.
func buildEngine(t testing.TB, lm loadedModel, device string, opts engine.Options) engine.Engine {
	t.Helper()
	if dev, n, ok := strings.Cut(device, "-tp"); ok {
		ranks, err := strconv.Atoi(n)
		if err != nil {
			t.Fatalf("device %q", device)
		}
		hf, ok := lm.w.(*model.HFWeights)
		if !ok {
			t.Fatalf("weights are %T, want *model.HFWeights", lm.w)
		}
		var e engine.Engine
		if dev == "emu" {
			e, err = gpu.NewShardedEmulated(gpu.FromHF(hf), opts, ranks)
		} else {
			if n, cerr := cuda.DeviceCount(); cerr != nil || n == 0 {
				t.Skipf("no CUDA GPU here (%v): the sharded GPU handoff runs on the H200 (scripts/gpu-check.sh)", cerr)
			}
			e, err = gpu.NewSharded(gpu.FromHF(hf), opts, gpu.ShardOptions{Devices: make([]int, ranks), Comm: gpu.CommOneShot})
		}
		if err != nil {
			t.Fatalf("%+v", err)
		}
		return e
	}
	if device != "cuda" {
		e, err := cpu.New(lm.cfg, lm.w, opts)
		if err != nil {
			t.Fatal(err)
		}
		return e
	}
	if n, err := cuda.DeviceCount(); err != nil || n == 0 {
		t.Skipf("no CUDA GPU here (%v): the GPU backend's handoff runs on the H200 (scripts/gpu-check.sh)", err)
	}
	hf, ok := lm.w.(*model.HFWeights)
	if !ok {
		t.Fatalf("weights are %T, want *model.HFWeights", lm.w)
	}
	e, err := gpu.New(gpu.FromHF(hf), opts)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

type rig struct {
	t     testing.TB
	node  *Node
	lm    loadedModel
	o     rigOpts
	ctrl  string
	base  string
	model string
}

// newTransfer makes a transfer engine of kind; NIXL skips the test when
// its library or UCX is not usable here.
func newTransfer(t testing.TB, kind string, listen bool) rdma.Engine {
	t.Helper()
	switch kind {
	case "", "tcp":
		cfg := rdma.TCPConfig{}
		if listen {
			cfg.Listen = "127.0.0.1:0"
		}
		e, err := rdma.NewTCP(cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = e.Close() })
		return e
	case "nixl":
		if os.Getenv("UCX_TLS") == "" {
			if err := nixl.Setenv("UCX_TLS", "tcp"); err != nil {
				t.Fatal(err)
			}
		}
		e, err := nixl.New(nixl.Config{})
		if errors.Is(err, nixl.ErrUnavailable) {
			t.Skipf("NIXL C API not available (set TILERT_NIXL_LIB or pip install nixl-cu12): %v", err)
		}
		if err != nil {
			t.Skipf("NIXL installed (%s) but its UCX backend did not start here (NIXL issue #838?): %v", nixl.LibraryPath(), err)
		}
		t.Cleanup(func() { _ = e.Close() })
		return e
	}
	t.Fatalf("unknown transport %q", kind)
	return nil
}

func newRig(t testing.TB, o rigOpts) *rig {
	t.Helper()
	if o.preset == "" {
		o.preset = "glm-5-tiny"
	}
	if o.slots == 0 {
		o.slots = 1
	}
	if o.kv == "" {
		o.kv = engine.CacheFP8DSMLA
	}
	if o.maxSeq == 0 {
		o.maxSeq = testMaxSeq
	}
	lm := loadModel(t, o.preset)
	eng := buildEngine(t, lm, o.device, engine.Options{Mode: engine.ModeServing, MLACache: o.kv, Slots: o.slots, MaxSeqLen: o.maxSeq, MTP: o.mtp})
	t.Cleanup(func() { _ = eng.Close() })
	tr := newTransfer(t, o.transport, true)
	node, err := New(Options{Engine: eng, Transfer: tr, Model: handoff.ModelName(lm.cfg.Family), VocabSize: lm.cfg.VocabSize, EOS: lm.cfg.EOS,
		StateTimeout: 20 * time.Second, ReserveDeadline: o.reserve, minBatch: o.minBatch, stepHook: o.stepHook,
		Security: o.sec, Log: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	ctrlLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	httpLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = node.ServeCtrl(ctrlLn) }()
	go func() { _ = node.ServeHTTP(httpLn) }()
	t.Cleanup(func() { _ = node.Close() })
	return &rig{t: t, node: node, lm: lm, o: o, ctrl: ctrlLn.Addr().String(), base: "http://" + httpLn.Addr().String(),
		model: handoff.ModelName(lm.cfg.Family)}
}

// prepared is one prompt's state as the sender has it, and what the
// sending engine itself generates from it.
type prepared struct {
	rid    string
	prompt []int
	first  int
	params engine.Params
	meta   engine.SlotMeta
	segs   []engine.Segment
	layout engine.Layout
	want   []int // tokens after first, the sender engine's own generation
	finish engine.FinishReason
}

var senderEngines sync.Map // key -> engine.Engine (one slot, used under senderMu)
var senderMu sync.Mutex

// prepare prefills prompt on a separate engine (same device, model and
// options as the node, its own max_seq_len), exports the state in vLLM's
// layout and then lets that engine continue on the same slot (Start+Step)
// for the reference tokens.
func prepare(t testing.TB, o rigOpts, rid string, prompt []int, p engine.Params) *prepared {
	t.Helper()
	if o.preset == "" {
		o.preset = "glm-5-tiny"
	}
	if o.kv == "" {
		o.kv = engine.CacheFP8DSMLA
	}
	lm := loadModel(t, o.preset)
	senderMu.Lock()
	defer senderMu.Unlock()
	key := fmt.Sprintf("%s/%v/%s/%s", o.preset, o.mtp, o.kv, o.device)
	v, ok := senderEngines.Load(key)
	if !ok {
		// A different max_seq_len than the node on purpose: the wire
		// regions do not depend on it. Kept for the whole run.
		e := buildEngine(t, lm, o.device, engine.Options{Mode: engine.ModeServing, MLACache: o.kv, Slots: 1, MaxSeqLen: 1024, MTP: o.mtp})
		senderEngines.Store(key, e)
		v = e
	}
	e := v.(engine.Engine)
	defer e.Release(0)
	if p.StopIDs == nil {
		p.StopIDs = lm.cfg.EOS
	}
	first, err := e.Prefill(0, prompt, p)
	if err != nil {
		t.Fatal(err)
	}
	meta, segs, err := e.Export(0)
	if err != nil {
		t.Fatal(err)
	}
	pr := &prepared{rid: rid, prompt: prompt, first: first, params: p, meta: meta, segs: segs, layout: e.Layout(), want: []int{}}
	fin, err := e.Start(0, first, p)
	if err != nil {
		t.Fatal(err)
	}
	for fin == engine.FinishNone {
		res, err := e.Step([]int{0})
		if err != nil {
			t.Fatal(err)
		}
		pr.want = append(pr.want, res[0].Tokens...)
		fin = res[0].Finish
	}
	pr.finish = fin
	return pr
}

func randomPrompt(seed uint64, n, vocab int) []int {
	r := rand.New(rand.NewPCG(seed, 1))
	out := make([]int, n)
	for i := range out {
		out[i] = 3 + r.IntN(vocab-3)
	}
	return out
}

var senderRegionID atomic.Uint32

func init() { senderRegionID.Store(5000) }

// sender is one ctrl connection with its own transfer engine.
type sender struct {
	t  testing.TB
	tr rdma.Engine
	c  *pd.Client
}

func newSender(t testing.TB, r *rig, kind string) *sender {
	t.Helper()
	return dialSender(t, r.ctrl, kind, handoff.Layout(r.model, r.node.layout))
}

func dialSender(t testing.TB, ctrl, kind string, want pd.Layout) *sender {
	t.Helper()
	tr := newTransfer(t, kind, false)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := pd.Dial(ctx, ctrl, tr, want)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return &sender{t: t, tr: tr, c: c}
}

// pack registers pr's packed state with the sender's engine.
func (s *sender) pack(pr *prepared) *handoff.Outgoing {
	s.t.Helper()
	out, err := handoff.Pack(pr.rid, rdma.RegionID(senderRegionID.Add(1)), pr.layout, pr.meta, pr.segs)
	if err != nil {
		s.t.Fatal(err)
	}
	if err := s.tr.Register(out.Region()); err != nil {
		s.t.Fatal(err)
	}
	s.t.Cleanup(func() { _ = s.tr.Deregister(out.ID) })
	return out
}

// send runs admit, writes and done for pr.
func (s *sender) send(pr *prepared) error {
	out := s.pack(pr)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, err := s.c.Send(ctx, out.Admit, out.Sources)
	return err
}

// decodeResult is a parsed /pd/decode answer.
type decodeResult struct {
	status int
	header http.Header
	lines  []string
	ids    []int
	final  map[string]any
	body   []byte // non-stream or error bodies
}

func (d *decodeResult) finishReason() string {
	s, _ := d.final["finish_reason"].(string)
	return s
}

func postJSON(t testing.TB, url string, body any) (*http.Response, error) {
	t.Helper()
	b, err := json.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	return http.Post(url, "application/json", bytes.NewReader(b))
}

// decodeBody builds a /pd/decode body for pr.
func decodeBody(pr *prepared) map[string]any {
	b := map[string]any{"rid": pr.rid, "first_token_id": pr.first, "max_tokens": pr.params.MaxTokens, "timeout_s": 20}
	if !pr.params.Greedy() {
		b["sampling"] = map[string]any{"temperature": pr.params.Temperature, "top_p": pr.params.TopP, "top_k": pr.params.TopK, "seed": pr.params.Seed}
	}
	return b
}

// readStream parses NDJSON lines until the final line.
func readStream(t testing.TB, resp *http.Response, onLine func(string)) *decodeResult {
	t.Helper()
	defer resp.Body.Close()
	d := &decodeResult{status: resp.StatusCode, header: resp.Header}
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "application/x-ndjson") {
		d.body, _ = io.ReadAll(resp.Body)
		_ = json.Unmarshal(d.body, &d.final)
		return d
	}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		d.lines = append(d.lines, line)
		if onLine != nil {
			onLine(line)
		}
		var m map[string]json.RawMessage
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("line %q: %v", line, err)
		}
		if raw, ok := m["t"]; ok && len(m) == 1 {
			var ids []int
			if err := json.Unmarshal(raw, &ids); err != nil || len(ids) == 0 {
				t.Fatalf("tokens line %q", line)
			}
			d.ids = append(d.ids, ids...)
			continue
		}
		if d.final != nil {
			t.Fatalf("line after the final line: %q", line)
		}
		_ = json.Unmarshal([]byte(line), &d.final)
	}
	if err := sc.Err(); err != nil {
		t.Fatalf("reading the stream: %v", err)
	}
	if d.final == nil {
		t.Fatalf("stream ended without a final line; lines %q", d.lines)
	}
	return d
}

func (r *rig) decode(t testing.TB, body map[string]any) *decodeResult {
	t.Helper()
	resp, err := postJSON(t, r.base+"/pd/decode", body)
	if err != nil {
		t.Fatal(err)
	}
	return readStream(t, resp, nil)
}

func (r *rig) getJSON(t testing.TB, path string, v any) int {
	t.Helper()
	resp, err := http.Get(r.base + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if v != nil {
		if err := json.Unmarshal(b, v); err != nil {
			t.Fatalf("GET %s: %v: %s", path, err, b)
		}
	}
	return resp.StatusCode
}

func (r *rig) metricsText(t testing.TB) string {
	t.Helper()
	resp, err := http.Get(r.base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// waitFor polls cond (status pages, not timing) until it holds.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	for i := 0; i < 2000; i++ {
		if cond() {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("gave up waiting for %s", what)
}

func (r *rig) allFree(t testing.TB) bool {
	var st decodeapi.Status
	r.getJSON(t, "/decode_status", &st)
	return st.Busy == 0 && len(st.Requests) == 0
}

// checkEqual compares a decode's stream with the sender's own generation.
func checkEqual(t testing.TB, pr *prepared, d *decodeResult) {
	t.Helper()
	if d.status != http.StatusOK {
		t.Fatalf("%s: status %d: %s", pr.rid, d.status, d.body)
	}
	if fmt.Sprint(d.ids) != fmt.Sprint(pr.want) {
		t.Fatalf("%s: node streamed %v\nlocal generation  %v", pr.rid, d.ids, pr.want)
	}
	if d.finishReason() != string(pr.finish) {
		t.Fatalf("%s: finish %q, local %q", pr.rid, d.finishReason(), pr.finish)
	}
	if n, _ := d.final["n"].(float64); int(n) != len(pr.want) {
		t.Fatalf("%s: final n %v, streamed %d", pr.rid, d.final["n"], len(pr.want))
	}
}

func readJSONBody(resp *http.Response, v any) error {
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	return json.Unmarshal(b, v)
}
