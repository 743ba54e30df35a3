package prefillshim

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/tilert-go/tilert/api/decodeapi"
	"github.com/tilert-go/tilert/config"
	"github.com/tilert-go/tilert/engine"
	"github.com/tilert-go/tilert/engine/cpu"
	"github.com/tilert-go/tilert/model"
	"github.com/tilert-go/tilert/model/synth"
	"github.com/tilert-go/tilert/pd"
	"github.com/tilert-go/tilert/rdma"
	"github.com/tilert-go/tilert/roles/decode"
)

const preset = "glm-5-tiny"

var (
	modelOnce sync.Once
	modelDir  string
	modelErr  error
)

func tinyModel(t *testing.T) string {
	t.Helper()
	modelOnce.Do(func() {
		d, err := os.MkdirTemp("", "tilert-sidecar-model-")
		if err != nil {
			modelErr = err
			return
		}
		modelDir = filepath.Join(d, preset)
		modelErr = synth.Write(preset, modelDir, 0, nil)
	})
	if modelErr != nil {
		t.Fatal(modelErr)
	}
	return modelDir
}

func TestMain(m *testing.M) {
	code := m.Run()
	if modelDir != "" {
		os.RemoveAll(filepath.Dir(modelDir))
	}
	os.Exit(code)
}

// node runs a real decode node (CPU backend, tcp transfer) on the tiny
// model and returns its ctrl and http addresses.
func node(t *testing.T, slots int) decodeapi.Addrs { return nodeWith(t, slots, "") }

// nodeWith is node with security.secret_file set to secretFile.
func nodeWith(t *testing.T, slots int, secretFile string) decodeapi.Addrs {
	t.Helper()
	cfg := config.Default()
	cfg.Security.SecretFile = secretFile
	cfg.Model.Name, cfg.Model.WeightsDir, cfg.Model.MaxSeqLen, cfg.Model.WithMTP = "glm5", tinyModel(t), 256, true
	cfg.Decode.Device, cfg.Decode.Host, cfg.Decode.CtrlPort, cfg.Decode.HTTPPort = "cpu", "127.0.0.1", 0, 0
	cfg.Decode.MaxInflight = slots
	cfg.Transfer.Listen = "127.0.0.1:0"
	addrFile := filepath.Join(t.TempDir(), "addr.json")
	ctx, stop := context.WithCancel(context.Background())
	runErr := make(chan error, 1)
	go func() { runErr <- decode.Run(ctx, cfg, addrFile) }()
	t.Cleanup(func() {
		stop()
		if err := <-runErr; err != nil {
			t.Errorf("decode.Run: %v", err)
		}
	})
	for i := 0; ; i++ {
		b, err := os.ReadFile(addrFile)
		var a decodeapi.Addrs
		if err == nil && json.Unmarshal(b, &a) == nil && a.Ctrl != "" {
			return a
		}
		select {
		case err := <-runErr:
			t.Fatalf("decode.Run ended: %v", err)
		case <-time.After(5 * time.Millisecond):
		}
	}
}

type harness struct {
	s      *Sidecar
	dir    string
	socket string
	log    *bytes.Buffer
	logMu  *sync.Mutex
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

func newHarness(t *testing.T, o Options) *harness {
	t.Helper()
	root, err := os.MkdirTemp("", "tsc") // unix socket paths are short
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(root) })
	h := &harness{dir: filepath.Join(root, "staging"), socket: filepath.Join(root, "s.sock"), log: &bytes.Buffer{}, logMu: &sync.Mutex{}}
	if err := os.Mkdir(h.dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if o.Transfer == nil {
		tr, err := rdma.NewTCP(rdma.TCPConfig{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { tr.Close() })
		o.Transfer = tr
	}
	o.StagingDir = h.dir
	if o.StagingBytes == 0 {
		o.StagingBytes = 64 << 20
	}
	o.Log = slog.New(slog.NewTextHandler(lockedWriter{h.logMu, h.log}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	s, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := listenUnix(h.socket)
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = s.Serve(ln) }()
	t.Cleanup(func() { ln.Close(); s.Close(5 * time.Second) })
	h.s = s
	return h
}

func (h *harness) logs() string {
	h.logMu.Lock()
	defer h.logMu.Unlock()
	return h.log.String()
}

// plugin is the Python plugin's side of the socket.
type plugin struct {
	t    *testing.T
	conn net.Conn
	br   *bufio.Reader
}

func (h *harness) dialPlugin(t *testing.T) *plugin {
	t.Helper()
	c, err := net.Dial("unix", h.socket)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &plugin{t: t, conn: c, br: bufio.NewReader(c)}
}

func (p *plugin) send(v any) {
	p.t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		p.t.Fatal(err)
	}
	if err := pd.WriteFrame(p.conn, b); err != nil {
		p.t.Fatal(err)
	}
}

func (p *plugin) recv() (map[string]any, error) {
	_ = p.conn.SetReadDeadline(time.Now().Add(30 * time.Second))
	b, err := pd.ReadFrame(p.br)
	if err != nil {
		return nil, err
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		p.t.Fatalf("reply %q: %v", b, err)
	}
	return m, nil
}

func (p *plugin) roundTrip(v any) map[string]any {
	p.t.Helper()
	p.send(v)
	m, err := p.recv()
	if err != nil {
		p.t.Fatalf("no reply: %v", err)
	}
	return m
}

// prefill runs the CPU engine on prompt (serving mode, vLLM's layouts, the
// MTP layer included) and returns its export, the first token and the
// tokens the same engine goes on to generate (maxTokens in all, greedy).
type prefilled struct {
	layout engine.Layout
	meta   engine.SlotMeta
	segs   []engine.Segment
	first  int
	want   []int
	stats  engine.Stats // the engine's counters after its own generation (MTP drafts, accepted)
}

func prefill(t *testing.T, prompt []int, maxTokens int) *prefilled {
	t.Helper()
	dir := tinyModel(t)
	mcfg, err := model.LoadConfig(dir)
	if err != nil {
		t.Fatal(err)
	}
	w, err := model.OpenWeights(dir)
	if err != nil {
		t.Fatal(err)
	}
	e, err := cpu.New(mcfg, w, engine.Options{Mode: engine.ModeServing, Slots: 1, MaxSeqLen: 256, MTP: true})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	p := engine.Params{MaxTokens: maxTokens}
	first, err := e.Prefill(0, prompt, p)
	if err != nil {
		t.Fatal(err)
	}
	meta, segs, err := e.Export(0)
	if err != nil {
		t.Fatal(err)
	}
	out := &prefilled{layout: e.Layout(), meta: meta, first: first, want: []int{first}}
	for _, sg := range segs { // Export's views die with the engine
		out.segs = append(out.segs, engine.Segment{Offset: sg.Offset, Data: append([]byte(nil), sg.Data...)})
	}
	fin, err := e.Start(0, first, p)
	for err == nil && fin == engine.FinishNone {
		var res []engine.StepResult
		if res, err = e.Step([]int{0}); err == nil {
			out.want = append(out.want, res[0].Tokens...)
			fin = res[0].Finish
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	out.stats = e.Stats()
	return out
}

// stage writes pf's state into a staging file the way the plugin does, but
// with the regions in reverse file order (the sidecar must restore the
// layout order), and returns the stage message.
func (h *harness) stage(t *testing.T, pf *prefilled, rid string, a decodeapi.Addrs) *Stage {
	t.Helper()
	host, port, err := net.SplitHostPort(a.Ctrl)
	if err != nil {
		t.Fatal(err)
	}
	pn, _ := strconv.Atoi(port)
	st := &Stage{Type: TypeStage, RID: rid, Host: host, CtrlPort: pn, Model: "glm5", KVCacheDType: string(pf.layout.MLACache),
		SeqLen: pf.meta.SeqLen, MTPLen: pf.meta.MTPLen, LastPromptToken: pf.meta.LastToken,
		Path: filepath.Join(h.dir, rid+".kv")}
	var file []byte
	for i := len(pf.segs) - 1; i >= 0; i-- {
		r := pf.layout.Regions[i]
		st.Regions = append(st.Regions, StageRegion{Layer: r.Layer, Kind: string(r.Kind), Offset: int64(len(file)), Bytes: int64(len(pf.segs[i].Data))})
		file = append(file, pf.segs[i].Data...)
	}
	st.FileBytes = int64(len(file))
	if err := os.WriteFile(st.Path, file, 0o600); err != nil {
		t.Fatal(err)
	}
	return st
}

func decodeStream(t *testing.T, httpAddr, rid string, first, maxTokens int) ([]int, string) {
	t.Helper()
	ids, done := decodeStreamDone(t, httpAddr, rid, first, maxTokens)
	return ids, done.Finish
}

// doneLine is the final line of a /pd/decode stream.
type doneLine struct {
	Finish        string  `json:"finish_reason"`
	N             int     `json:"n"`
	MTPAcceptMean float64 `json:"mtp_accept_mean"`
}

// decodeStreamDone is decodeStream returning the whole final line.
func decodeStreamDone(t *testing.T, httpAddr, rid string, first, maxTokens int) ([]int, doneLine) {
	return decodeStreamAs(t, httpAddr, "", rid, first, maxTokens)
}

// decodeStreamAs is decodeStreamDone presenting token to /pd/decode.
func decodeStreamAs(t *testing.T, httpAddr, token, rid string, first, maxTokens int) ([]int, doneLine) {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"rid": rid, "first_token_id": first, "max_tokens": maxTokens, "ignore_eos": true,
		"timeout_s": 60, "sampling": map[string]any{"temperature": 0}})
	req, _ := http.NewRequest("POST", "http://"+httpAddr+"/pd/decode", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("/pd/decode %s: %s", resp.Status, b)
	}
	ids := []int{first}
	var done doneLine
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		var m struct {
			T     []int  `json:"t"`
			Done  bool   `json:"done"`
			Error string `json:"error"`
			doneLine
		}
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("line %q: %v", sc.Bytes(), err)
		}
		if m.Error != "" {
			t.Fatalf("/pd/decode error: %s", sc.Bytes())
		}
		ids = append(ids, m.T...)
		if m.Done {
			done = m.doneLine
		}
	}
	return ids, done
}

func waitGone(t *testing.T, path string) {
	t.Helper()
	for i := 0; ; i++ {
		if _, err := os.Stat(path); os.IsNotExist(err) {
			return
		}
		if i > 6000 {
			t.Fatalf("staging file %s was never deleted", path)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (h *harness) waitOutcome(t *testing.T, outcome string, n float64) {
	t.Helper()
	for i := 0; ; i++ {
		if h.s.m.requests.With(outcome).Value() >= n {
			return
		}
		if i > 6000 {
			t.Fatalf("outcome %s never reached %v; log:\n%s", outcome, n, h.logs())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// The plugin's socket side against a real decode node: the node decodes
// exactly what the CPU engine generates from the same state, the staging
// file is deleted and the outcome is logged and counted.
func TestShipToDecodeNode(t *testing.T) {
	a := node(t, 1)
	h := newHarness(t, Options{})
	p := h.dialPlugin(t)
	hello := p.roundTrip(map[string]any{"type": "hello"})
	if hello["type"] != TypeHello || hello["staging_dir"] != h.dir || hello["transport"] != "tcp" {
		t.Fatalf("hello %v", hello)
	}
	for i, prompt := range [][]int{
		{5, 17, 300, 42, 9, 77, 512, 1000},
		// more than one 64-token page
		func() []int {
			out := make([]int, 150)
			for j := range out {
				out[j] = (j*37 + 11) % 1000
			}
			return out
		}(),
	} {
		const maxTokens = 12
		pf := prefill(t, prompt, maxTokens)
		rid := "r-" + strconv.Itoa(i)
		st := h.stage(t, pf, rid, a)
		rep := p.roundTrip(st)
		if rep["type"] != TypeQueued || rep["rid"] != rid {
			t.Fatalf("stage %s: %v\n%s", rid, rep, h.logs())
		}
		got, finish := decodeStream(t, a.HTTP, rid, pf.first, maxTokens)
		if !slices.Equal(got, pf.want) || finish != "length" {
			t.Fatalf("%s: node decoded %v (%s), the CPU engine %v", rid, got, finish, pf.want)
		}
		waitGone(t, st.Path)
		h.waitOutcome(t, OutcomeOK, float64(i+1))
		if !strings.Contains(h.logs(), "rid="+rid) {
			t.Fatalf("no log line for %s:\n%s", rid, h.logs())
		}
	}
	if d := h.s.m.dials.Value(); d != 1 {
		t.Errorf("%v ctrl dials for two requests to one node, want 1 (connection reuse)", d)
	}
	get := func(path string) (int, string) {
		var ctx fasthttp.RequestCtx
		ctx.Request.Header.SetMethod("GET")
		ctx.Request.SetRequestURI(path)
		h.s.Handler()(&ctx)
		return ctx.Response.StatusCode(), string(ctx.Response.Body())
	}
	_, body := get("/metrics")
	for _, s := range []string{`tilert_sidecar_requests_total{outcome="ok"} 2`, "tilert_sidecar_transfer_bytes_total", "tilert_sidecar_queue_depth 0"} {
		if !strings.Contains(body, s) {
			t.Errorf("/metrics lacks %q:\n%s", s, body)
		}
	}
	if code, body := get("/health"); code != 200 || !strings.Contains(body, `"status":"ok"`) {
		t.Errorf("/health %d %s", code, body)
	}
}

// The stage's mtp_len goes through to the admit: one position short the
// node recomputes it and decodes what the CPU engine does; two short an MTP
// node refuses (bad_request), which it could not if the field were dropped.
func TestMTPLenPassThrough(t *testing.T) {
	a := node(t, 1)
	h := newHarness(t, Options{})
	p := h.dialPlugin(t)
	const maxTokens = 10
	pf := prefill(t, []int{7, 70, 700, 17, 170, 3, 33, 333, 90}, maxTokens)
	for i, c := range []struct {
		short  int
		reject string
	}{{0, ""}, {1, ""}, {2, pd.ReasonBadRequest}} {
		rid := "mtp-" + strconv.Itoa(c.short)
		st := h.stage(t, pf, rid, a)
		st.MTPLen = st.SeqLen - c.short
		if rep := p.roundTrip(st); rep["type"] != TypeQueued {
			t.Fatalf("%s: %v", rid, rep)
		}
		if c.reject != "" {
			h.waitOutcome(t, OutcomeRejected+c.reject, 1)
			if !strings.Contains(h.logs(), "mtp_len") {
				t.Fatalf("the reject's reason is not logged:\n%s", h.logs())
			}
		} else {
			got, finish := decodeStream(t, a.HTTP, rid, pf.first, maxTokens)
			if !slices.Equal(got, pf.want) || finish != "length" {
				t.Fatalf("%s: node decoded %v (%s), the CPU engine %v", rid, got, finish, pf.want)
			}
			h.waitOutcome(t, OutcomeOK, float64(i+1))
		}
		waitGone(t, st.Path)
	}
}

// A node whose only slot is taken answers busy; the sidecar retries and
// ships once the slot frees, without the plugin noticing.
func TestBusyRetry(t *testing.T) {
	a := node(t, 1)
	h := newHarness(t, Options{})
	p := h.dialPlugin(t)
	pf1 := prefill(t, []int{1, 2, 3, 4, 5}, 6)
	pf2 := prefill(t, []int{9, 8, 7, 6}, 6)
	if rep := p.roundTrip(h.stage(t, pf1, "first", a)); rep["type"] != TypeQueued {
		t.Fatal(rep)
	}
	h.waitOutcome(t, OutcomeOK, 1)
	// "first" holds the slot (ready, unclaimed) until its /pd/decode.
	if rep := p.roundTrip(h.stage(t, pf2, "second", a)); rep["type"] != TypeQueued {
		t.Fatal(rep)
	}
	for i := 0; h.s.m.retries.With("busy").Value() < 1; i++ {
		if i > 6000 {
			t.Fatalf("no busy retry; log:\n%s", h.logs())
		}
		time.Sleep(5 * time.Millisecond)
	}
	if got, _ := decodeStream(t, a.HTTP, "first", pf1.first, 6); !slices.Equal(got, pf1.want) {
		t.Fatalf("first: %v, want %v", got, pf1.want)
	}
	if got, _ := decodeStream(t, a.HTTP, "second", pf2.first, 6); !slices.Equal(got, pf2.want) {
		t.Fatalf("second: %v, want %v", got, pf2.want)
	}
	h.waitOutcome(t, OutcomeOK, 2)
}

// Refusals end with a logged outcome and a metric, never silently: a layout
// the node does not serve, a dead node, a full staging budget.
func TestOutcomes(t *testing.T) {
	a := node(t, 1)
	pf := prefill(t, []int{3, 1, 4, 1, 5, 9, 2, 6}, 4)

	t.Run("layout_mismatch", func(t *testing.T) {
		h := newHarness(t, Options{})
		p := h.dialPlugin(t)
		st := h.stage(t, pf, "wrong-model", a)
		st.Model = "deepseek-v3.2"
		if rep := p.roundTrip(st); rep["type"] != TypeQueued {
			t.Fatal(rep)
		}
		h.waitOutcome(t, OutcomeRejected+pd.ReasonLayoutMismatch, 1)
		waitGone(t, st.Path)
		if !strings.Contains(h.logs(), "outcome=rejected_layout_mismatch") {
			t.Fatalf("log:\n%s", h.logs())
		}
	})
	t.Run("connect_failed", func(t *testing.T) {
		h := newHarness(t, Options{})
		p := h.dialPlugin(t)
		ln, _ := net.Listen("tcp", "127.0.0.1:0")
		dead := ln.Addr().String()
		ln.Close()
		st := h.stage(t, pf, "nobody", decodeapi.Addrs{Ctrl: dead})
		if rep := p.roundTrip(st); rep["type"] != TypeQueued {
			t.Fatal(rep)
		}
		h.waitOutcome(t, OutcomeConnectFailed, 1)
		waitGone(t, st.Path)
	})
	t.Run("staging_full", func(t *testing.T) {
		h := newHarness(t, Options{StagingBytes: 1000})
		p := h.dialPlugin(t)
		st := h.stage(t, pf, "big", a)
		rep := p.roundTrip(st)
		if rep["type"] != TypeError || rep["error"] != ErrCodeStagingFull {
			t.Fatal(rep)
		}
		h.waitOutcome(t, OutcomeStagingFull, 1)
		waitGone(t, st.Path)
		// the connection stays usable
		if hello := p.roundTrip(map[string]any{"type": "hello"}); hello["type"] != TypeHello {
			t.Fatal(hello)
		}
	})
}

// Bad frames get an error reply and close only that connection; bad stages
// get an error reply; the sidecar keeps serving.
func TestBadFrames(t *testing.T) {
	h := newHarness(t, Options{})
	a := decodeapi.Addrs{Ctrl: "127.0.0.1:1"}
	pf := &prefilled{layout: mustLayout(t), meta: engine.SlotMeta{SeqLen: 3, MTPLen: 3, LastToken: 7}}
	for _, r := range pf.layout.Regions {
		pf.segs = append(pf.segs, engine.Segment{Offset: r.Offset, Data: make([]byte, r.PageBytes)})
	}
	frames := []struct {
		name string
		raw  []byte
	}{
		{"oversize", binary.BigEndian.AppendUint32(nil, pd.MaxFrame+1)},
		{"zero length", binary.BigEndian.AppendUint32(nil, 0)},
		{"not json", frame([]byte("{nope"))},
		{"not an object", frame([]byte(`[1,2]`))},
		{"unknown type", frame([]byte(`{"type":"launch"}`))},
		{"wrong field type", frame([]byte(`{"type":"stage","seq_len":"ten"}`))},
	}
	for _, f := range frames {
		t.Run(f.name, func(t *testing.T) {
			p := h.dialPlugin(t)
			if _, err := p.conn.Write(f.raw); err != nil {
				t.Fatal(err)
			}
			m, err := p.recv()
			if err != nil || m["type"] != TypeError || m["error"] != ErrCodeBadFrame {
				t.Fatalf("reply %v, %v", m, err)
			}
			if _, err := p.recv(); err == nil {
				t.Fatal("the connection stayed open after a bad frame")
			}
		})
	}
	outside := filepath.Join(t.TempDir(), "victim.kv")
	if err := os.WriteFile(outside, []byte("keep me"), 0o600); err != nil {
		t.Fatal(err)
	}
	stages := []struct {
		name   string
		mut    func(*Stage)
		delete bool // the staging file is the sidecar's and goes
	}{
		{"path outside the staging dir", func(s *Stage) { s.Path = outside }, false},
		{"path with dot dot", func(s *Stage) { s.Path = filepath.Join(h.dir, "..", filepath.Base(outside)) }, false},
		{"mtp_len negative", func(s *Stage) { s.MTPLen = -1 }, true},
		{"mtp_len past seq_len", func(s *Stage) { s.MTPLen = s.SeqLen + 1 }, true},
		{"no rid", func(s *Stage) { s.RID = "" }, true},
		{"bad port", func(s *Stage) { s.CtrlPort = 70000 }, true},
		{"region past the file", func(s *Stage) { s.Regions[0].Bytes += 64 }, true},
		{"unknown kind", func(s *Stage) { s.Regions[0].Kind = "kv" }, true},
		{"duplicate region", func(s *Stage) { s.Regions[1] = s.Regions[0] }, true},
		{"file size differs", func(s *Stage) { s.FileBytes-- }, true},
	}
	p := h.dialPlugin(t)
	for i, c := range stages {
		t.Run(c.name, func(t *testing.T) {
			st := h.stage(t, pf, "bad-"+strconv.Itoa(i), a)
			path := st.Path
			c.mut(st)
			rep := p.roundTrip(st)
			if rep["type"] != TypeError || rep["error"] != ErrCodeBadRequest {
				t.Fatalf("reply %v", rep)
			}
			if _, err := os.Stat(path); os.IsNotExist(err) != c.delete {
				t.Fatalf("staging file deleted=%v, want %v", os.IsNotExist(err), c.delete)
			}
			os.Remove(path)
		})
	}
	if b, err := os.ReadFile(outside); err != nil || string(b) != "keep me" {
		t.Fatalf("a file outside the staging dir was touched: %q %v", b, err)
	}
	if hello := p.roundTrip(map[string]any{"type": "hello"}); hello["type"] != TypeHello {
		t.Fatalf("sidecar stopped serving: %v", hello)
	}
	if got := h.s.m.requests.With(OutcomeBadRequest).Value(); got != float64(len(stages)) {
		t.Fatalf("bad_request outcomes %v, want %d", got, len(stages))
	}
}

func frame(b []byte) []byte { return append(binary.BigEndian.AppendUint32(nil, uint32(len(b))), b...) }

func mustLayout(t *testing.T) engine.Layout {
	l, err := engine.NewLayout(engine.CacheFP8DSMLA, 512, 64, 128, 128, []bool{true, true})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// Run: the command's wiring (socket, staging dir, metrics, drain).
func TestRun(t *testing.T) {
	root, err := os.MkdirTemp("", "tsr")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(root)
	cfg := config.Default()
	cfg.Sidecar.Socket = filepath.Join(root, "run.sock")
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	cfg.Sidecar.MetricsPort = port
	ctx, stop := context.WithCancel(context.Background())
	readyc := make(chan Ready, 1)
	errc := make(chan error, 1)
	go func() { errc <- Run(ctx, cfg, func(r Ready) { readyc <- r }) }()
	var r Ready
	select {
	case r = <-readyc:
	case err := <-errc:
		t.Fatalf("Run: %v", err)
	}
	defer os.RemoveAll(r.StagingDir)
	c, err := net.Dial("unix", r.Socket)
	if err != nil {
		t.Fatal(err)
	}
	p := &plugin{t: t, conn: c, br: bufio.NewReader(c)}
	if hello := p.roundTrip(map[string]any{"type": "hello"}); hello["staging_dir"] != r.StagingDir {
		t.Fatalf("hello %v, ready %+v", hello, r)
	}
	c.Close()
	resp, err := http.Get("http://" + r.Metrics + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(b), "tilert_sidecar_requests_total") {
		t.Fatalf("/metrics: %s", b)
	}
	stop()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(cfg.Sidecar.Socket); !os.IsNotExist(err) {
		t.Fatalf("socket left behind: %v", err)
	}
}
