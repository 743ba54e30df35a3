package prefillshim

import (
	"bytes"
	"context"
	"encoding/json"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/tilert-go/tilert/engine"
	"github.com/tilert-go/tilert/rdma"
)

// pytorchPython finds a python3 with torch and pytest the way the Makefile's
// test-python does (python3, then /usr/bin/python3), or "" when none has both.
func pytorchPython() string {
	for _, p := range []string{"python3", "/usr/bin/python3"} {
		path, err := exec.LookPath(p)
		if err != nil {
			continue
		}
		if exec.Command(path, "-c", "import torch, pytest").Run() == nil {
			return path
		}
	}
	return ""
}

// The real Python plugin (python/tilert/pd_vllm) against the real sidecar
// and a real decode node: python/tests/e2e_driver.py plays vLLM around the
// plugin (paged caches of stale bytes, a random block table, chunked
// prefill, the V1 connector call sequence), the plugin gathers a CPU
// engine's exported state out of those blocks into a staging file and
// announces it on the sidecar's socket, the sidecar ships it, and the node
// must decode exactly what the engine itself generates from that state.
func TestPythonPluginEndToEnd(t *testing.T) {
	py := pytorchPython()
	if py == "" {
		t.Skip("no python3 with torch and pytest (apt-get install python3-torch python3-pytest): the plugin cannot run here")
	}
	pyRoot, err := filepath.Abs(filepath.Join("..", "..", "python"))
	if err != nil {
		t.Fatal(err)
	}
	readPython(t, pyRoot)
	driver := filepath.Join(pyRoot, "tests", "e2e_driver.py")

	// 150 tokens: three pages, the last one partly used.
	prompt := make([]int, 150)
	for i := range prompt {
		prompt[i] = (i*113 + 29) % 1000
	}
	const maxTokens = 16
	pf := prefill(t, prompt, maxTokens)
	if pf.meta.MTPLen != pf.meta.SeqLen {
		t.Fatalf("engine export has mtp_len %d for seq_len %d; the plugin always stages both equal", pf.meta.MTPLen, pf.meta.SeqLen)
	}
	if pf.meta.LastToken != prompt[len(prompt)-1] {
		t.Fatalf("engine export last token %d, prompt ends in %d", pf.meta.LastToken, prompt[len(prompt)-1])
	}

	a := node(t, 1)
	tcp, err := rdma.NewTCP(rdma.TCPConfig{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tcp.Close() })
	rec := &recordingTransfer{Engine: tcp}
	h := newHarness(t, Options{Transfer: rec})
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("sidecar log:\n%s", h.logs())
		}
	})
	host, port, err := net.SplitHostPort(a.Ctrl)
	if err != nil {
		t.Fatal(err)
	}
	pn, _ := strconv.Atoi(port)

	// The exported pages, one region after another, for the driver.
	work := t.TempDir()
	type specRegion struct {
		Layer  int    `json:"layer"`
		Kind   string `json:"kind"`
		Offset int    `json:"offset"`
		Bytes  int    `json:"bytes"`
	}
	var state []byte
	var regions []specRegion
	for i, sg := range pf.segs {
		r := pf.layout.Regions[i]
		regions = append(regions, specRegion{Layer: r.Layer, Kind: string(r.Kind), Offset: len(state), Bytes: len(sg.Data)})
		state = append(state, sg.Data...)
	}
	if last := regions[len(regions)-1]; last.Layer != pf.layout.NumLayers-1 {
		t.Fatalf("the last exported region is layer %d, want the MTP layer %d", last.Layer, pf.layout.NumLayers-1)
	}
	stateFile := filepath.Join(work, "state.bin")
	if err := os.WriteFile(stateFile, state, 0o600); err != nil {
		t.Fatal(err)
	}
	const rid = "e2e-rid-1"
	spec, _ := json.Marshal(map[string]any{
		"socket": h.socket, "host": host, "ctrl_port": pn, "rid": rid, "model": "glm5",
		"kv_cache_dtype": string(pf.layout.MLACache), "prompt_ids": prompt, "num_blocks": 24, "seed": 7,
		"state_file": stateFile, "regions": regions,
	})
	specFile := filepath.Join(work, "spec.json")
	if err := os.WriteFile(specFile, spec, 0o600); err != nil {
		t.Fatal(err)
	}

	cmd := exec.Command(py, driver, specFile)
	cmd.Env = append(os.Environ(), "PYTHONDONTWRITEBYTECODE=1")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s %s: %v\nstdout:\n%s\nstderr:\n%s\nsidecar log:\n%s", py, driver, err, stdout.String(), stderr.String(), h.logs())
	}
	var res struct {
		Staged   []string `json:"staged"`
		Blocks   []int    `json:"block_ids"`
		ShipStep int      `json:"shipped_in_step"`
		Frames   []Stage  `json:"frames"`
	}
	if err := json.Unmarshal(stdout.Bytes(), &res); err != nil {
		t.Fatalf("driver output %q: %v\nstderr:\n%s", stdout.String(), err, stderr.String())
	}
	if len(res.Staged) != 1 || res.Staged[0] != rid {
		t.Fatalf("plugin staged %v, want [%s]\nstderr:\n%s\nsidecar log:\n%s", res.Staged, rid, stderr.String(), h.logs())
	}
	if res.ShipStep != 2 {
		t.Fatalf("plugin shipped in step %d of the chunked prefill, want 2 (the step that computes the last prompt token)", res.ShipStep)
	}

	var st *Stage
	for i := range res.Frames {
		if res.Frames[i].Type == TypeStage {
			if st != nil {
				t.Fatalf("plugin sent two stage frames: %+v", res.Frames)
			}
			st = &res.Frames[i]
		}
	}
	if st == nil {
		t.Fatalf("plugin sent no stage frame: %+v", res.Frames)
	}
	if st.RID != rid || st.Host != host || st.CtrlPort != pn || st.Model != "glm5" || st.KVCacheDType != string(pf.layout.MLACache) ||
		st.SeqLen != pf.meta.SeqLen || st.MTPLen != pf.meta.MTPLen || st.LastPromptToken != pf.meta.LastToken {
		t.Fatalf("stage frame %+v; want rid %s, node %s, glm5, %s, seq_len = mtp_len = %d, last token %d",
			st, rid, a.Ctrl, pf.layout.MLACache, pf.meta.SeqLen, pf.meta.LastToken)
	}

	got, done := decodeStreamDone(t, a.HTTP, rid, pf.first, maxTokens)
	if !slices.Equal(got, pf.want) || done.Finish != "length" || done.N != len(pf.want)-1 {
		t.Fatalf("node decoded %v (%s) from the plugin's staging (blocks %v), the CPU engine %v\nsidecar log:\n%s",
			got, done.Finish, res.Blocks, pf.want, h.logs())
	}
	// Greedy output does not depend on the MTP layer's cache (drafts are
	// verified); the drafts accepted do, so they check that layer's bytes.
	if pf.stats.DraftTokens == 0 {
		t.Fatal("the CPU engine drafted no MTP tokens: the MTP layer's state goes unchecked")
	}
	if want := float64(pf.stats.AcceptedTokens) / float64(pf.stats.DraftTokens); done.MTPAcceptMean != want {
		t.Fatalf("node's MTP acceptance %v, the CPU engine's own %v (%d/%d): the MTP layer's state differs",
			done.MTPAcceptMean, want, pf.stats.AcceptedTokens, pf.stats.DraftTokens)
	}
	h.waitOutcome(t, OutcomeOK, 1)
	waitEmpty(t, h.dir)

	// Every layer's used positions, the MTP layer's included (greedy tokens
	// do not depend on it: drafts are verified), went out byte for byte as
	// the engine exported them; the last page's tail is the driver's stale
	// bytes and is not compared.
	sent := rec.registered()
	if len(sent) != 1 || int64(len(sent[0])) != st.FileBytes {
		t.Fatalf("sidecar registered %d regions, want one staging file of %d bytes", len(sent), st.FileBytes)
	}
	if len(st.Regions) != len(pf.segs) {
		t.Fatalf("stage frame has %d regions, the engine exported %d", len(st.Regions), len(pf.segs))
	}
	for i, sg := range pf.segs {
		r := pf.layout.Regions[i]
		var sr *StageRegion
		for j := range st.Regions {
			if st.Regions[j].Layer == r.Layer && st.Regions[j].Kind == string(r.Kind) {
				sr = &st.Regions[j]
			}
		}
		if sr == nil || sr.Bytes != int64(len(sg.Data)) {
			t.Fatalf("stage frame region for L%d.%s: %+v, want %d bytes", r.Layer, r.Kind, sr, len(sg.Data))
		}
		staged := sent[0][sr.Offset : sr.Offset+sr.Bytes]
		for _, span := range usedSpans(pf.layout, r, pf.meta.SeqLen) {
			if !bytes.Equal(staged[span[0]:span[1]], sg.Data[span[0]:span[1]]) {
				t.Fatalf("L%d.%s: staged bytes [%d,%d) differ from the engine's export (blocks %v)", r.Layer, r.Kind, span[0], span[1], res.Blocks)
			}
		}
	}
}

// usedSpans are the byte ranges of region r's first seqLen positions
// within its used pages (docs/LAYOUTS.md).
func usedSpans(l engine.Layout, r engine.Region, seqLen int) [][2]int {
	if r.Kind == engine.RegionMLA {
		return [][2]int{{0, seqLen * l.MLATokenBytes}}
	}
	var out [][2]int
	const page = engine.BlockSize
	for p := 0; p*page < seqLen; p++ {
		n := min(seqLen-p*page, page)
		base := p * l.IndexerPageBytes
		vals := page * l.IndexHeadDim
		out = append(out, [2]int{base, base + n*l.IndexHeadDim}, [2]int{base + vals, base + vals + 4*n*(l.IndexHeadDim/128)})
	}
	return out
}

// recordingTransfer keeps a copy of every host region the sidecar registers
// (the mapped staging file) before it is sent.
type recordingTransfer struct {
	rdma.Engine
	mu   sync.Mutex
	regs [][]byte
}

func (r *recordingTransfer) Register(reg rdma.Region) error {
	r.mu.Lock()
	r.regs = append(r.regs, append([]byte(nil), reg.Host...))
	r.mu.Unlock()
	return r.Engine.Register(reg)
}

// ConnectAs keeps the wrapped engine's session binding (pd.Dial connects
// a SessionConnector under the ctrl session; the node refuses other writes).
func (r *recordingTransfer) ConnectAs(ctx context.Context, endpoint, session string) (rdma.Peer, error) {
	return r.Engine.(rdma.SessionConnector).ConnectAs(ctx, endpoint, session)
}

func (r *recordingTransfer) registered() [][]byte {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.regs
}

// waitEmpty waits until the sidecar has deleted every staging file in dir.
func waitEmpty(t *testing.T, dir string) {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		waitGone(t, filepath.Join(dir, e.Name()))
	}
}

// readPython reads every .py file under dir: go test caches results by the
// files a test opens, and the Python side runs in another process.
func readPython(t *testing.T, dir string) {
	t.Helper()
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".py") {
			return err
		}
		_, err = os.ReadFile(path)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}
