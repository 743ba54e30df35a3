package prefillshim

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tilert-go/tilert/api/decodeapi"
	"github.com/tilert-go/tilert/config"
	"github.com/tilert-go/tilert/model/synth"
	"github.com/tilert-go/tilert/rdma"
	"github.com/tilert-go/tilert/roles/decode"
)

// The vLLM side on the GPU (TILERT_GPU_E2E=1, on the H200): a Python
// process holding vLLM-shaped CUDA cache tensors (vLLM 0.33's 4-D views of
// one buffer) runs the real plugin; the real sidecar maps those caches by
// CUDA IPC (or takes /dev/shm staging files) and ships them to a decode
// node running the GPU backend on the same machine.
//
//	TILERT_GPU_E2E=1 [TILERT_GPU_E2E_OUT=dir] [TILERT_GPU_E2E_CTX=8192,32768] go test ./roles/prefillshim -run GPU -v
//
// vLLM itself is not needed there: the plugin imports vLLM's connector base
// when installed, else the stand-in (checked for drift by make test-vllm).
func gpuE2E(t *testing.T) (py, device string) {
	if os.Getenv("TILERT_GPU_E2E") != "1" {
		t.Skip("set TILERT_GPU_E2E=1 to run the plugin -> sidecar -> GPU decode node test (on a GPU machine)")
	}
	device = "cuda"
	if d := os.Getenv("TILERT_GPU_E2E_DEVICE"); d != "" { // cpu: a dry run of the flow on a machine without a GPU
		device = d
	}
	py = os.Getenv("TILERT_PYTHON")
	if py == "" {
		py = pytorchPython()
	}
	if py == "" {
		t.Fatal("no python3 with torch (set TILERT_PYTHON)")
	}
	return py, device
}

// nodeOn runs a decode node on device with the model in dir.
func nodeOn(t *testing.T, dir, name, device string, maxSeq int) decodeapi.Addrs {
	t.Helper()
	cfg := config.Default()
	cfg.Model.Name, cfg.Model.WeightsDir, cfg.Model.MaxSeqLen, cfg.Model.WithMTP = name, dir, maxSeq, true
	cfg.Decode.Device, cfg.Decode.Host, cfg.Decode.CtrlPort, cfg.Decode.HTTPPort = device, "127.0.0.1", 0, 0
	cfg.Decode.MaxInflight = 1
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
	for {
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

// gpuSidecar is a sidecar with the real CUDA device access (zero-copy on).
func gpuSidecar(t *testing.T, device string) *harness {
	t.Helper()
	o := Options{}
	var reader rdma.DeviceReader
	if device == "cuda" {
		g, err := newGPUAccess()
		if err != nil {
			t.Fatalf("GPU access: %v", err)
		}
		t.Cleanup(g.close)
		o.Device, reader = g, g
	}
	tr, err := rdma.NewTCP(rdma.TCPConfig{DeviceReader: reader})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tr.Close() })
	o.Transfer = tr
	o.StagingBytes = 8 << 30
	h := newHarness(t, o)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("sidecar log:\n%s", h.logs())
		}
	})
	return h
}

func writeOut(t *testing.T, name string, b []byte) {
	if dir := os.Getenv("TILERT_GPU_E2E_OUT"); dir != "" {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Error(err)
		}
	}
}

// TestGPUPluginDecodes: the decoded ids equal the engine's own
// continuation, through the zero-copy path and through /dev/shm.
func TestGPUPluginDecodes(t *testing.T) {
	py, device := gpuE2E(t)
	pyRoot, _ := filepath.Abs(filepath.Join("..", "..", "python"))
	driver := filepath.Join(pyRoot, "tests", "e2e_driver.py")
	prompt := make([]int, 150)
	for i := range prompt {
		prompt[i] = (i*113 + 29) % 1000
	}
	const maxTokens = 16
	pf := prefill(t, prompt, maxTokens) // the CPU engine's state and continuation
	a := nodeOn(t, tinyModel(t), "glm5", device, 256)
	h := gpuSidecar(t, device)
	host, port, _ := net.SplitHostPort(a.Ctrl)
	pn, _ := strconv.Atoi(port)
	work := t.TempDir()
	var state []byte
	var regions []map[string]any
	for i, sg := range pf.segs {
		r := pf.layout.Regions[i]
		regions = append(regions, map[string]any{"layer": r.Layer, "kind": string(r.Kind), "offset": len(state), "bytes": len(sg.Data)})
		state = append(state, sg.Data...)
	}
	stateFile := filepath.Join(work, "state.bin")
	if err := os.WriteFile(stateFile, state, 0o600); err != nil {
		t.Fatal(err)
	}
	var report bytes.Buffer
	modes := []string{"ipc", "shm"}
	if device != "cuda" {
		modes = []string{"shm"}
	}
	for i, mode := range modes {
		rid := "gpu-e2e-" + mode
		spec, _ := json.Marshal(map[string]any{
			"socket": h.socket, "host": host, "ctrl_port": pn, "rid": rid, "model": "glm5",
			"kv_cache_dtype": string(pf.layout.MLACache), "prompt_ids": prompt, "num_blocks": 24, "seed": 7 + i,
			"state_file": stateFile, "regions": regions, "device": device, "transfer": mode, "layout": "BLNHC",
		})
		specFile := filepath.Join(work, mode+".json")
		if err := os.WriteFile(specFile, spec, 0o600); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(py, driver, specFile)
		cmd.Env = append(os.Environ(), "PYTHONDONTWRITEBYTECODE=1")
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err != nil {
			t.Fatalf("%s: %v\n%s\n%s", mode, err, stdout.String(), stderr.String())
		}
		var res struct {
			Staged []string `json:"staged"`
			Mode   string   `json:"mode"`
		}
		if err := json.Unmarshal(stdout.Bytes(), &res); err != nil {
			t.Fatalf("%s: driver output %q: %v\n%s", mode, stdout.String(), err, stderr.String())
		}
		if res.Mode != mode || len(res.Staged) != 1 {
			t.Fatalf("%s: the plugin used %q and staged %v\n%s", mode, res.Mode, res.Staged, stderr.String())
		}
		got, done := decodeStreamDone(t, a.HTTP, rid, pf.first, maxTokens)
		ok := slices.Equal(got, pf.want) && done.Finish == "length"
		line := map[string]any{"mode": mode, "device": device, "decoded": got, "engine": pf.want, "equal": ok,
			"mtp_accept_mean": done.MTPAcceptMean}
		b, _ := json.Marshal(line)
		report.Write(append(b, '\n'))
		t.Logf("%s", b)
		if !ok {
			t.Errorf("%s: the node decoded %v, the engine's own continuation is %v", mode, got, pf.want)
		}
	}
	writeOut(t, "gpu-plugin-decodes.jsonl", report.Bytes())
}

// TestGPUHandoff times the hand-off of DeepSeek-V3.2's real state size
// (61 + 1 layers) at 8K and 32K tokens, zero-copy vs /dev/shm, same run.
func TestGPUHandoff(t *testing.T) {
	py, device := gpuE2E(t)
	ctxs := []int{8192, 32768}
	if s := os.Getenv("TILERT_GPU_E2E_CTX"); s != "" {
		ctxs = nil
		for _, f := range strings.Split(s, ",") {
			n, err := strconv.Atoi(f)
			if err != nil {
				t.Fatal(err)
			}
			ctxs = append(ctxs, n)
		}
	}
	maxCtx := 0
	for _, c := range ctxs {
		maxCtx = max(maxCtx, c)
	}
	dir := filepath.Join(t.TempDir(), "ds61")
	if err := synth.Write("deepseek-v3.2-tiny-61", dir, 0, nil); err != nil {
		t.Fatal(err)
	}
	a := nodeOn(t, dir, "deepseek-v3.2", device, maxCtx+64)
	h := gpuSidecar(t, device)
	host, port, _ := net.SplitHostPort(a.Ctrl)
	pn, _ := strconv.Atoi(port)
	modes := []string{"ipc", "shm"}
	if device != "cuda" {
		modes = []string{"shm"}
	}
	reps := 3
	if n, err := strconv.Atoi(os.Getenv("TILERT_GPU_E2E_REPS")); err == nil {
		reps = n
	}
	spec, _ := json.Marshal(map[string]any{"socket": h.socket, "host": host, "ctrl_port": pn, "http": a.HTTP,
		"model": "deepseek-v3.2", "layers": 62, "ctx": ctxs, "modes": modes, "reps": reps, "device": device})
	specFile := filepath.Join(t.TempDir(), "bench.json")
	if err := os.WriteFile(specFile, spec, 0o600); err != nil {
		t.Fatal(err)
	}
	pyRoot, _ := filepath.Abs(filepath.Join("..", "..", "python"))
	cmd := exec.Command(py, filepath.Join(pyRoot, "tests", "handoff_bench.py"), specFile)
	cmd.Env = append(os.Environ(), "PYTHONDONTWRITEBYTECODE=1", "PYTHONUNBUFFERED=1")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if dir := os.Getenv("TILERT_GPU_E2E_OUT"); dir != "" { // lines as they come: a run cut short keeps them
		f, err := os.Create(filepath.Join(dir, "handoff.jsonl"))
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		cmd.Stdout = io.MultiWriter(&stdout, f)
	}
	err := cmd.Run()
	if err != nil {
		t.Fatalf("handoff_bench: %v\n%s\n%s", err, stdout.String(), stderr.String())
	}
	sc := bufio.NewScanner(&stdout)
	n := 0
	for sc.Scan() {
		var r struct {
			Ctx     int      `json:"ctx"`
			Mode    string   `json:"mode"`
			Asked   string   `json:"asked"`
			Handoff *float64 `json:"handoff_ms"`
			Blocked float64  `json:"step_blocked_ms"`
			Error   string   `json:"error"`
		}
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatalf("line %q: %v", sc.Text(), err)
		}
		t.Logf("%s", sc.Text())
		if r.Error != "" || r.Handoff == nil {
			t.Errorf("ctx %d %s: the state never reached the node: %s", r.Ctx, r.Asked, r.Error)
		}
		if r.Mode != r.Asked {
			t.Errorf("ctx %d: asked for %s, the plugin used %s\n%s", r.Ctx, r.Asked, r.Mode, stderr.String())
		}
		n++
	}
	if n != len(ctxs)*len(modes)*reps {
		t.Fatalf("%d results, want %d\n%s", n, len(ctxs)*len(modes)*reps, stderr.String())
	}
}
