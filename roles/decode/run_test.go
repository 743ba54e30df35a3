package decode

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/api/decodeapi"
	"github.com/tilert-go/tilert/config"
	"github.com/tilert-go/tilert/converter"
	"github.com/tilert-go/tilert/cuda"
	"github.com/tilert-go/tilert/engine"
	"github.com/tilert-go/tilert/internal/cliutil"
	"github.com/tilert-go/tilert/pd"
)

func runConfig(weights string) *config.Config {
	cfg := config.Default()
	cfg.Model.Name, cfg.Model.WeightsDir, cfg.Model.MaxSeqLen, cfg.Model.WithMTP = "glm-5", weights, 256, true
	cfg.Decode.Device, cfg.Decode.Host, cfg.Decode.CtrlPort, cfg.Decode.HTTPPort = "cpu", "127.0.0.1", 0, 0
	cfg.Transfer.Listen = "127.0.0.1:0"
	return cfg
}

// The whole role: HF and converted weights, both ports, a request, and a
// graceful stop that lets the request in flight finish.
func TestRunServesAndStopsGracefully(t *testing.T) {
	hf := presetDir(t, "glm-5-tiny")
	conv := filepath.Join(testRoot, "glm-5-tiny-converted")
	if _, err := os.Stat(conv); err != nil {
		if _, err := converter.Convert(context.Background(), converter.Options{ModelDir: hf, SaveDir: conv, AppendMTP: true, Devices: 1}); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct{ name, dir string }{{"hf checkpoint", hf}, {"converted weights", conv}} {
		t.Run(c.name, func(t *testing.T) {
			cfg := runConfig(c.dir)
			addrFile := filepath.Join(t.TempDir(), "addr.json")
			ctx, stop := context.WithCancel(context.Background())
			defer stop()
			runErr := make(chan error, 1)
			go func() { runErr <- Run(ctx, cfg, addrFile) }()
			var addrs decodeapi.Addrs
			waitFor(t, "the address file", func() bool {
				b, err := os.ReadFile(addrFile)
				return err == nil && json.Unmarshal(b, &addrs) == nil
			})
			r := &rig{base: "http://" + addrs.HTTP, ctrl: addrs.Ctrl, lm: loadModel(t, "glm-5-tiny")}
			var capa decodeapi.Capabilities
			if code := r.getJSON(t, "/capabilities", &capa); code != 200 || capa.Model != "glm5" || !capa.MTP || capa.Device != "cpu" || capa.Devices != nil {
				t.Fatalf("capabilities %d %+v", code, capa)
			}
			o := rigOpts{mtp: true}
			pr := prepare(t, o, "run", randomPrompt(111, 50, r.lm.cfg.VocabSize), engine.Params{MaxTokens: 40})
			s := dialSender(t, addrs.Ctrl, "tcp", pd0(capa))
			if err := s.send(pr); err != nil {
				t.Fatal(err)
			}
			resp, err := postJSON(t, r.base+"/pd/decode", decodeBody(pr))
			if err != nil {
				t.Fatal(err)
			}
			// Stop the node while the request streams: it must finish.
			lines := 0
			d := readStream(t, resp, func(string) {
				if lines++; lines == 1 {
					stop()
				}
			})
			checkEqual(t, pr, d)
			if err := <-runErr; err != nil {
				t.Fatalf("Run: %v", err)
			}
			if _, err := http.Get(r.base + "/health"); err == nil {
				t.Fatal("http port still open after Run returned")
			}
		})
	}
}

type setupCase struct {
	name   string
	edit   func(*config.Config)
	want   string
	usage  bool
	notCPU bool
}

func TestRunRefusesBadSetups(t *testing.T) {
	hf := presetDir(t, "glm-5-tiny")
	cases := []setupCase{
		{"unknown device", func(c *config.Config) { c.Decode.Device = "tpu" }, "tpu", true, false},
		{"no weights", func(c *config.Config) { c.Model.WeightsDir = "" }, "--model-weights-dir", true, false},
		{"empty dir", func(c *config.Config) { c.Model.WeightsDir = t.TempDir() }, "neither converted weights", false, false},
		{"wrong family", func(c *config.Config) { c.Model.Name = "deepseek-v3.2" }, "glm5", true, false},
		{"bad kv dtype", func(c *config.Config) { c.Model.KVCacheDType = "int4" }, "int4", true, false},
		{"bad transfer", func(c *config.Config) { c.Transfer.Engine = "carrier-pigeon" }, "tcp or nixl", true, false},
		{"zero inflight", func(c *config.Config) { c.Decode.MaxInflight = 0 }, "max-inflight", true, false},
		{"devices on the cpu", func(c *config.Config) { c.Decode.Device, c.Decode.Devices = "cpu", "0,1" }, "--device cuda", true, false},
		{"bad devices", func(c *config.Config) { c.Decode.Devices = "0,gpu1" }, "not a GPU ordinal", true, false},
	}
	if n, err := cuda.DeviceCount(); err != nil || n == 0 {
		// Without a GPU, --device cuda fails at start and points at the CPU backend.
		cases = append(cases, setupCase{"cuda device without a GPU", func(c *config.Config) { c.Decode.Device = "cuda" }, "--device cpu", false, false})
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg := runConfig(hf)
			c.edit(cfg)
			err := Run(context.Background(), cfg, "")
			if err == nil {
				t.Fatal("Run accepted it")
			}
			text := err.Error() + " " + strings.Join(errors.GetAllHints(err), " ")
			if !strings.Contains(text, c.want) {
				t.Fatalf("error %q (hints included) does not mention %q", text, c.want)
			}
			var ec interface{ ExitCode() int }
			if (c.usage || c.notCPU) && (!errors.As(err, &ec) || ec.ExitCode() != cliutil.ExitUsage) {
				t.Fatalf("exit code: %v", err)
			}
		})
	}
}

// pd0 is the ctrl layout a node's capabilities announce.
func pd0(c decodeapi.Capabilities) pd.Layout {
	return pd.Layout{Model: c.Model, LayoutVersion: c.LayoutVersion, KVCacheDType: c.KVCacheDType, NumLayers: c.NumLayers}
}

// Shutdown closes the ctrl port at once, so a request still waiting for its
// state is told 503 (go elsewhere) rather than left to time out.
func TestShutdownReleasesWaiters(t *testing.T) {
	r := newRig(t, rigOpts{})
	res := make(chan *decodeResult, 1)
	go func() { res <- r.decode(t, map[string]any{"rid": "waiter", "first_token_id": 2, "timeout_s": 60}) }()
	waitFor(t, "the request to wait", func() bool {
		var st decodeapi.Status
		r.getJSON(t, "/decode_status", &st)
		return len(st.Requests) == 1
	})
	if err := r.node.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	d := <-res
	if d.status != http.StatusServiceUnavailable || d.final["error"] != "shutting_down" {
		t.Fatalf("waiter after shutdown: %d %s", d.status, d.body)
	}
	if _, err := pd.Dial(context.Background(), r.ctrl, newTransfer(t, "tcp", false), pd.Layout{}); err == nil {
		t.Fatal("ctrl port still open after Shutdown")
	}
}
