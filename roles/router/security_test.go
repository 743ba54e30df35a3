package router

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tilert-go/tilert/api/decodeapi"
	"github.com/tilert-go/tilert/config"
	"github.com/tilert-go/tilert/internal/devvllm"
	"github.com/tilert-go/tilert/roles/decode"
)

// readAddr waits for an --addr-file and decodes it into v.
func readAddr(t *testing.T, path string, v any, errc chan error) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		if b, err := os.ReadFile(path); err == nil && json.Unmarshal(b, v) == nil {
			return
		}
		select {
		case err := <-errc:
			t.Fatalf("a process ended while starting: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %s", path)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// The whole stack with a shared secret and API keys, each role as its
// command runs it: the router presents its token to the node, dev-vllm
// (the sidecar's stand-in) proves the secret on the ctrl and transfer
// ports, clients need a key; without the token the node refuses /pd/*.
func TestSecuredStack(t *testing.T) {
	dir := tinyModel(t)
	tmp := t.TempDir()
	secretFile := filepath.Join(tmp, "secret")
	keysFile := filepath.Join(tmp, "keys")
	_ = os.WriteFile(secretFile, []byte("stack-secret-0123456789abcdef0123"), 0o600)
	_ = os.WriteFile(keysFile, []byte("sk-stack-0123456789abcdef\n"), 0o600)
	base := func() *config.Config {
		cfg := config.Default()
		cfg.Security.SecretFile = secretFile
		return cfg
	}
	ctx, stop := context.WithCancel(context.Background())
	errc := make(chan error, 3)
	var running int
	t.Cleanup(func() {
		stop()
		for range running {
			if err := <-errc; err != nil {
				t.Errorf("a role ended with %v", err)
			}
		}
	})

	ncfg := base()
	ncfg.Model.Name, ncfg.Model.WeightsDir, ncfg.Model.MaxSeqLen, ncfg.Model.WithMTP = "glm5", dir, 256, true
	ncfg.Decode.Device, ncfg.Decode.Host, ncfg.Decode.CtrlPort, ncfg.Decode.HTTPPort = "cpu", "127.0.0.1", 0, 0
	nodeAddr := filepath.Join(tmp, "node.json")
	running++
	go func() { errc <- decode.Run(ctx, ncfg, nodeAddr) }()
	var na decodeapi.Addrs
	readAddr(t, nodeAddr, &na, errc)

	secret, _ := base().Secret()
	vAddr := filepath.Join(tmp, "vllm.json")
	running++
	go func() {
		errc <- devvllm.Run(ctx, devvllm.RunOptions{ModelDir: dir, Host: "127.0.0.1", Port: 0, ServedModel: "glm-5-tiny",
			Transfer: "tcp", MaxSeqLen: 256, AddrFile: vAddr, Secret: secret})
	}()
	var va map[string]string
	readAddr(t, vAddr, &va, errc)

	rcfg := base()
	rcfg.Model.Path = dir
	rcfg.Router.VLLMURL = "http://" + va["http"]
	rcfg.Router.Decode = []string{"127.0.0.1:" + strings.Split(na.Ctrl, ":")[1] + ":" + strings.Split(na.HTTP, ":")[1]}
	rcfg.Router.Port, rcfg.Router.Host, rcfg.Router.APIKeysFile = 0, "127.0.0.1", keysFile
	rAddr := filepath.Join(tmp, "router.json")
	running++
	go func() { errc <- Run(ctx, rcfg, rAddr) }()
	var ra map[string]string
	readAddr(t, rAddr, &ra, errc)
	url := "http://" + ra["http"] + "/v1/completions"
	body := `{"model":"glm-5-tiny","prompt":"The decode engine","max_tokens":6,"temperature":0}`

	if resp, b := call(t, http.DefaultClient, "POST", url, "", body); resp.StatusCode != 401 {
		t.Fatalf("no key: %d %s", resp.StatusCode, b)
	}
	resp, b := call(t, http.DefaultClient, "POST", url, "sk-stack-0123456789abcdef", body)
	var out struct {
		Choices []struct {
			FinishReason string `json:"finish_reason"`
		}
		Usage struct {
			CompletionTokens int `json:"completion_tokens"`
		}
	}
	if resp.StatusCode != 200 || json.Unmarshal(b, &out) != nil || len(out.Choices) != 1 || out.Usage.CompletionTokens != 6 {
		t.Fatalf("with the key: %d %s", resp.StatusCode, b)
	}
	// The node's /pd/* wants the router's token.
	if resp, b := call(t, http.DefaultClient, "POST", "http://"+na.HTTP+decodeapi.PathCancel, "", `{"rid":"x"}`); resp.StatusCode != 401 {
		t.Fatalf("/pd/cancel without the token: %d %s", resp.StatusCode, b)
	}
}
