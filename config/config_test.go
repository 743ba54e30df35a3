package config

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/cockroachdb/errors"
)

var update = flag.Bool("update", false, "rewrite ../tilert.toml.example from the struct tags")

func writeFile(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "tilert.toml")
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func noEnv(string) (string, bool) { return "", false }

func envOf(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

func TestPrecedence(t *testing.T) {
	file := writeFile(t, "[decode]\nctrl_port = 6000\nhttp_port = 6001\nmax_inflight = 2\n[model]\nname = \"deepseek-v3.2\"\n")
	tests := []struct {
		name    string
		env     map[string]string
		flags   map[string]any
		path    string
		want    any
		wantSrc Source
	}{
		{"default", nil, nil, "decode.state_timeout_s", 30.0, SourceDefault},
		{"file over default", nil, nil, "decode.ctrl_port", 6000, SourceFile},
		{"env over file", map[string]string{"TILERT_DECODE_CTRL_PORT": "7000"}, nil, "decode.ctrl_port", 7000, SourceEnv},
		{"flag over env", map[string]string{"TILERT_DECODE_CTRL_PORT": "7000"}, map[string]any{"decode.ctrl_port": 8000}, "decode.ctrl_port", 8000, SourceFlag},
		{"flag over file", nil, map[string]any{"model.name": "glm-5.1"}, "model.name", "glm-5.1", SourceFlag},
		{"env list", map[string]string{"TILERT_ROUTER_DECODE": "a:1:2, b:3:4"}, nil, "router.decode", []string{"a:1:2", "b:3:4"}, SourceEnv},
		{"env bool", map[string]string{"TILERT_MODEL_WITH_MTP": "true"}, nil, "model.with_mtp", true, SourceEnv},
		{"env float", map[string]string{"TILERT_ROUTER_QUEUE_TIMEOUT_S": "2.5"}, nil, "router.queue_timeout_s", 2.5, SourceEnv},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, src, err := Load(Options{File: file, Env: envOf(tc.env), Flags: tc.flags})
			if err != nil {
				t.Fatal(err)
			}
			f, _ := Lookup(tc.path)
			if got := f.Get(c); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("%s = %v, want %v", tc.path, got, tc.want)
			}
			if src[tc.path] != tc.wantSrc {
				t.Errorf("source of %s = %s, want %s", tc.path, src[tc.path], tc.wantSrc)
			}
		})
	}
}

func TestUnknownKeys(t *testing.T) {
	tests := []struct {
		name, body string
		want       []string // substrings of message + hints
	}{
		{"typo in key", "[decode]\nhttp_port = 5557\nctrl_prot = 5556\n", []string{":3", "decode.ctrl_prot", "did you mean decode.ctrl_port"}},
		{"typo in section", "[decod]\nctrl_port = 5556\n", []string{"[decod]", "did you mean [decode]"}},
		{"no near key", "[router]\nzzzzzzzzzz = 1\n", []string{"router.zzzzzzzzzz", "keys in [router]"}},
		{"bare key", "ctrl_port = 5556\n", []string{"ctrl_port", "section"}},
		{"key as table", "decode = 3\n", []string{"must be a table"}},
		{"wrong type", "[decode]\nctrl_port = \"x\"\n", []string{"tilert.toml:2", "decode.ctrl_port must be an integer, got a TOML string", "ctrl_port = 5556"}},
		{"wrong type bool", "[model]\nwith_mtp = 1\n", []string{"model.with_mtp must be a boolean, got a TOML integer"}},
		{"syntax", "[decode\nctrl_port = 1\n", []string{"tilert.toml:1"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := Load(Options{File: writeFile(t, tc.body), Env: noEnv})
			if err == nil {
				t.Fatal("want an error")
			}
			full := err.Error() + " | " + strings.Join(errors.GetAllHints(err), " | ")
			if strings.Contains(full, "struct") || strings.Contains(full, "config.") {
				t.Errorf("error %q names Go types; say it in the TOML file's words", full)
			}
			for _, w := range tc.want {
				if !strings.Contains(full, w) {
					t.Errorf("error %q lacks %q", full, w)
				}
			}
		})
	}
}

func TestValidation(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "plain-file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		path string
		set  any
	}{
		{"log.level", "loud"},
		{"log.format", "xml"},
		{"model.name", "llama"},
		{"model.max_seq_len", 0},
		{"model.kv_cache_dtype", "int4"},
		{"model.path", filepath.Join(dir, "missing")},
		{"model.weights_dir", file},
		{"transfer.engine", "mooncake"},
		{"transfer.listen", "nohostport"},
		{"transfer.streams", 0},
		{"transfer.nixl_lib", filepath.Join(dir, "libnixl_capi.so")},
		{"convert.model_dir", filepath.Join(dir, "missing")},
		{"convert.devices", 0},
		{"convert.save_dir", filepath.Join(dir, "no", "such", "out")},
		{"decode.engine", "vllm"},
		{"decode.device", "tpu"},
		{"decode.ctrl_port", 70000},
		{"decode.http_port", 5556}, // equals ctrl_port
		{"decode.max_inflight", 0},
		{"decode.prefill_precision", "bf16"},
		{"decode.state_timeout_s", 0.0},
		{"decode.slot_reserve_ttl_s", -1.0},
		{"router.port", 70000},
		{"router.vllm_url", "prefill-node:8000"},
		{"router.decode[0]", []string{"decode-node:5556"}},
		{"router.queue_size", -1},
		{"router.queue_timeout_s", 0.0},
		{"sidecar.socket", ""},
		{"sidecar.metrics_port", -1},
		{"sidecar.staging_mib", 0},
	}
	for _, tc := range tests {
		t.Run(tc.path, func(t *testing.T) {
			key := tc.path
			if i := strings.Index(key, "["); i > 0 {
				key = key[:i]
			}
			_, _, err := Load(Options{Env: noEnv, Flags: map[string]any{key: tc.set}})
			var ve *ValidationError
			if !errors.As(err, &ve) {
				t.Fatalf("want a ValidationError, got %v", err)
			}
			if got := ve.Paths(); len(got) != 1 || got[0] != tc.path {
				t.Fatalf("problems at %v, want exactly [%s]: %v", got, tc.path, err)
			}
			if len(errors.GetAllHints(err)) == 0 {
				t.Error("no hint")
			}
		})
	}
}

func TestDefaultsValid(t *testing.T) {
	if err := Default().Validate(); err != nil {
		t.Fatal(err)
	}
}

func TestEnvErrors(t *testing.T) {
	_, _, err := Load(Options{Env: envOf(map[string]string{"TILERT_DECODE_CTRL_PORT": "abc"})})
	if err == nil || !strings.Contains(err.Error(), "TILERT_DECODE_CTRL_PORT") {
		t.Fatalf("want an error naming the variable, got %v", err)
	}
}

func TestParseDecodeNode(t *testing.T) {
	tests := []struct {
		in   string
		want DecodeNode
		ok   bool
	}{
		{"decode-node:5556:5557", DecodeNode{"decode-node", 5556, 5557}, true},
		{"[::1]:1:2", DecodeNode{"::1", 1, 2}, true},
		{"10.0.0.1:5556", DecodeNode{}, false},
		{"h:x:5557", DecodeNode{}, false},
		{"h:5556:0", DecodeNode{}, false},
		{":1:2", DecodeNode{}, false},
	}
	for _, tc := range tests {
		got, err := ParseDecodeNode(tc.in)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("ParseDecodeNode(%q) = %v, %v", tc.in, got, err)
		}
	}
}

// TestExample keeps tilert.toml.example in step with the struct tags and
// proves it parses to exactly the defaults it documents.
func TestExample(t *testing.T) {
	const path = "../tilert.toml.example"
	if *update {
		if err := os.WriteFile(path, []byte(Example()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if string(data) != Example() {
		t.Errorf("%s is stale; run go test ./config -run TestExample -update", path)
	}
	c, src, err := Load(Options{File: path, Env: noEnv})
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(c, Default()) {
		t.Errorf("example parses to %+v, want the defaults %+v", c, Default())
	}
	for _, f := range Fields() {
		if src[f.Path()] != SourceFile {
			t.Errorf("example does not set %s", f.Path())
		}
	}
}

func TestPrintRoundTrip(t *testing.T) {
	c := Default()
	c.Decode.CtrlPort = 6100
	c.Router.Decode = []string{"a:1:2"}
	src := Sources{"decode.ctrl_port": SourceFlag}
	var buf bytes.Buffer
	if err := Print(&buf, c, src); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(buf.String(), "ctrl_port = 6100  # flag") {
		t.Errorf("print lacks the flag source:\n%s", buf.String())
	}
	got, _, err := Load(Options{File: writeFile(t, buf.String()), Env: noEnv})
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, c) {
		t.Errorf("printed config does not parse back to itself")
	}
}

func TestEveryFieldDocumented(t *testing.T) {
	for _, f := range Fields() {
		if f.Help == "" || f.Key == "" {
			t.Errorf("%s has no help or key tag", f.Path())
		}
	}
}
