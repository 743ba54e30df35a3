package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/urfave/cli/v2"

	"github.com/tilert-go/tilert/config"
	"github.com/tilert-go/tilert/internal/cliutil"
	"github.com/tilert-go/tilert/roles/convert"
	"github.com/tilert-go/tilert/roles/decode"
	"github.com/tilert-go/tilert/roles/router"
)

// run executes the app as main does and returns stdout, stderr and the exit code.
func run(t *testing.T, args ...string) (string, string, int) {
	t.Helper()
	var out, errb bytes.Buffer
	app := newApp()
	app.Writer, app.ErrWriter = &out, &errb
	code := cliutil.Report(&errb, app.Run(append([]string{"tilert"}, args...)))
	return out.String(), errb.String(), code
}

func TestHelpListsRoles(t *testing.T) {
	out, _, code := run(t, "--help")
	if code != 0 {
		t.Fatalf("exit %d", code)
	}
	for _, role := range []string{"convert", "decode", "router", "connector-sidecar", "config", "version"} {
		if !strings.Contains(out, role) {
			t.Errorf("--help does not list %s", role)
		}
	}
}

func TestRoleHelpShowsFlagsDefaultsEnv(t *testing.T) {
	tests := []struct {
		role string
		want []string
	}{
		{"decode", []string{"--ctrl-port", "5556", "TILERT_DECODE_CTRL_PORT", "--model-weights-dir", "--with-mtp", "--kv-cache-dtype", "--max-seq-len", "202752"}},
		{"router", []string{"--vllm-url", "--decode", "--model-path", "--port", "23333", "TILERT_ROUTER_PORT"}},
		{"convert", []string{"--model", "model_type", "--model-dir", "model_dir", "--save-dir", "save_dir", "TILERT_CONVERT_SAVE_DIR"}},
		{"connector-sidecar", []string{"--socket", "TILERT_SIDECAR_SOCKET"}},
	}
	for _, tc := range tests {
		t.Run(tc.role, func(t *testing.T) {
			out, _, code := run(t, tc.role, "--help")
			if code != 0 {
				t.Fatalf("exit %d", code)
			}
			for _, w := range tc.want {
				if !strings.Contains(out, w) {
					t.Errorf("%s --help lacks %q", tc.role, w)
				}
			}
		})
	}
}

// capture swaps a role's action for one that records the loaded config,
// so the launch post's command lines are checked for what they set.
func capture(t *testing.T, cmd *cli.Command, flags []config.Flag) **config.Config {
	var got *config.Config
	cmd.Action = func(c *cli.Context) error {
		cfg, _, err := cliutil.Load(c, flags)
		got = cfg
		return err
	}
	return &got
}

func TestLaunchPostCommandLinesParse(t *testing.T) {
	weights := t.TempDir()
	hf := t.TempDir()
	save := filepath.Join(t.TempDir(), "out")

	t.Run("decode", func(t *testing.T) {
		app := newApp()
		got := capture(t, findCmd(app, "decode"), decode.Flags)
		err := app.Run([]string{"tilert", "decode",
			"--engine", "tilert", "--model", "glm5",
			"--model-weights-dir", weights,
			"--with-mtp", "--max-seq-len", "202752",
			"--kv-cache-dtype", "fp8",
			"--ctrl-port", "5556", "--http-port", "5557"})
		if err != nil {
			t.Fatal(err)
		}
		c := *got
		if c.Model.WeightsDir != weights || !c.Model.WithMTP || c.Model.MaxSeqLen != 202752 ||
			c.Decode.CtrlPort != 5556 || c.Decode.HTTPPort != 5557 || c.Model.Name != "glm5" || c.Model.KVCacheDType != "fp8" {
			t.Errorf("decode flags not applied: %+v %+v", c.Model, c.Decode)
		}
	})
	t.Run("router", func(t *testing.T) {
		app := newApp()
		got := capture(t, findCmd(app, "router"), router.Flags)
		err := app.Run([]string{"tilert", "router",
			"--vllm-url", "http://prefill-node:8000",
			"--decode", "decode-node:5556:5557", "--decode", "decode-2:5556:5557",
			"--model-path", hf, "--port", "23333"})
		if err != nil {
			t.Fatal(err)
		}
		c := *got
		if c.Router.VLLMURL != "http://prefill-node:8000" || len(c.Router.Decode) != 2 || c.Model.Path != hf || c.Router.Port != 23333 {
			t.Errorf("router flags not applied: %+v", c.Router)
		}
	})
	t.Run("convert python spelling", func(t *testing.T) {
		app := newApp()
		got := capture(t, findCmd(app, "convert"), convert.Flags)
		err := app.Run([]string{"tilert", "convert", "--model_type", "glm-5", "--model_dir", hf, "--save_dir", save})
		if err != nil {
			t.Fatal(err)
		}
		c := *got
		if c.Model.Name != "glm-5" || c.Convert.ModelDir != hf || c.Convert.SaveDir != save {
			t.Errorf("convert flags not applied: %+v", c.Convert)
		}
	})
}

// TestDecodePrefillPrecision: decode.prefill_precision by flag, by
// environment and by default, and a value it does not know refused.
func TestDecodePrefillPrecision(t *testing.T) {
	weights := t.TempDir()
	for _, tc := range []struct {
		name, env string
		args      []string
		want      string
		bad       bool
	}{
		{name: "default", want: "float32"},
		{name: "flag", args: []string{"--prefill-precision", "fast"}, want: "fast"},
		{name: "env", env: "fast", want: "fast"},
		{name: "flag over env", env: "fast", args: []string{"--prefill-precision", "float32"}, want: "float32"},
		{name: "unknown", args: []string{"--prefill-precision", "bf16"}, bad: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("TILERT_DECODE_PREFILL_PRECISION", tc.env) // restored after the test
			if tc.env == "" {
				os.Unsetenv("TILERT_DECODE_PREFILL_PRECISION")
			}
			app := newApp()
			got := capture(t, findCmd(app, "decode"), decode.Flags)
			err := app.Run(append([]string{"tilert", "decode", "--model-weights-dir", weights}, tc.args...))
			if tc.bad {
				if err == nil || !strings.Contains(err.Error(), "prefill_precision") {
					t.Fatalf("err %v, want one naming decode.prefill_precision", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if p := (*got).Decode.PrefillPrec; p != tc.want {
				t.Errorf("prefill_precision %q, want %q", p, tc.want)
			}
		})
	}
}

func findCmd(app *cli.App, name string) *cli.Command {
	for _, c := range app.Commands {
		if c.Name == name {
			return c
		}
	}
	return nil
}

func TestConfigCheck(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.toml")
	if err := os.WriteFile(bad, []byte("[decode]\nhttp_port = 5557\nctrl_prot = 5556\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, stderr, code := run(t, "config", "check", "--config", bad)
	if code != 1 {
		t.Errorf("exit %d, want 1", code)
	}
	for _, w := range []string{"bad.toml:3", "decode.ctrl_prot", "did you mean decode.ctrl_port"} {
		if !strings.Contains(stderr, w) {
			t.Errorf("stderr lacks %q:\n%s", w, stderr)
		}
	}
	out, _, code := run(t, "config", "check", "--config", "tilert.toml.example")
	if code != 0 || !strings.Contains(out, "config OK") {
		t.Errorf("example config: exit %d, %s", code, out)
	}
}

func TestConfigPrintSources(t *testing.T) {
	dir := t.TempDir()
	f := filepath.Join(dir, "c.toml")
	if err := os.WriteFile(f, []byte("[router]\nport = 24000\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv("TILERT_DECODE_HTTP_PORT", "6001")
	out, stderr, code := run(t, "config", "print", "--config", f, "--set", "decode.ctrl_port=6000")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	for _, w := range []string{"port = 24000  # file", "http_port = 6001  # env", "ctrl_port = 6000  # flag", "max_inflight = 1  # default"} {
		if !strings.Contains(out, w) {
			t.Errorf("print lacks %q:\n%s", w, out)
		}
	}
}

func TestUnbuiltRoleExits2(t *testing.T) {
	// Every role has landed; the not-built path still exits 2 with its hint.
	var errb bytes.Buffer
	if code := cliutil.Report(&errb, cliutil.NotBuilt("x", "not here")); code != 2 || !strings.Contains(errb.String(), "not available") {
		t.Errorf("NotBuilt: exit %d, stderr %s", code, errb.String())
	}
	// A router without what it needs is a usage error (2) naming it.
	_, stderr, code := run(t, "router", "--vllm-url", "http://x:8000")
	if code != 2 || !strings.Contains(stderr, "--model-path") {
		t.Errorf("router: exit %d, stderr %s", code, stderr)
	}
}

func TestVersion(t *testing.T) {
	out, _, code := run(t, "version")
	if code != 0 || !strings.Contains(out, "tilert ") || !strings.Contains(out, "go1.") {
		t.Errorf("version: exit %d, %q", code, out)
	}
}

func TestUsageErrorExits2(t *testing.T) {
	_, _, code := run(t, "decode", "--no-such-flag")
	if code != 2 {
		t.Errorf("exit %d, want 2", code)
	}
}

func TestSynthThenGenerate(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "glm")
	if _, stderr, code := run(t, "synth", "--preset", "glm-5-tiny", "--out", dir); code != 0 {
		t.Fatalf("synth: exit %d: %s", code, stderr)
	}
	gen := func(extra ...string) string {
		out, stderr, code := run(t, append([]string{"generate", "--model-dir", dir, "--prompt-ids", "5,6,7,8,9",
			"--max-tokens", "8", "--ignore-eos"}, extra...)...)
		if code != 0 {
			t.Fatalf("generate %v: exit %d: %s", extra, code, stderr)
		}
		for _, line := range strings.Split(out, "\n") {
			if strings.HasPrefix(line, "ids: ") {
				if n := len(strings.Split(strings.TrimPrefix(line, "ids: "), ",")); n != 8 {
					t.Errorf("generate %v: %d ids, want 8: %s", extra, n, line)
				}
				return line
			}
		}
		t.Fatalf("generate %v printed no ids:\n%s", extra, out)
		return ""
	}
	// Greedy output must not depend on speculation.
	if a, b := gen("--mode", "serving"), gen("--mode", "serving", "--mtp"); a != b {
		t.Errorf("MTP changed greedy output:\n%s\n%s", a, b)
	}
	gen("--mode", "exact")
}

func TestGenerateBadInput(t *testing.T) {
	tests := [][]string{
		{"generate", "--prompt-ids", "1,2"},
		{"generate", "--model-dir", t.TempDir(), "--prompt-ids", "1,x"},
		{"generate", "--model-dir", t.TempDir(), "--prompt-ids", "1", "--mode", "fast"},
		{"generate", "--model-dir", t.TempDir(), "--prompt-ids", "1", "--top-p", "1.5"},
		{"generate", "--model-dir", t.TempDir(), "--prompt-ids", "1", "--min-p", "2"},
		{"generate", "--model-dir", t.TempDir(), "--prompt-ids", "1", "--temperature", "-1"},
		{"generate", "--model-dir", t.TempDir(), "--prompt-ids", "1", "--top-k", "-3"},
		{"synth", "--preset", "llama-tiny", "--out", filepath.Join(t.TempDir(), "x")},
	}
	for _, args := range tests {
		_, stderr, code := run(t, args...)
		if code == 0 || !strings.Contains(stderr, "error") {
			t.Errorf("%v: exit %d, stderr %q", args, code, stderr)
		}
		// A sampling flag out of range is named, before any model is read.
		if f := args[len(args)-2]; slices.Contains([]string{"--top-p", "--min-p", "--temperature", "--top-k"}, f) && !strings.Contains(stderr, f) {
			t.Errorf("%v: stderr %q does not name %s", args, stderr, f)
		}
	}
}

func TestBenchDecode(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "ds")
	if _, stderr, code := run(t, "synth", "--preset", "deepseek-v3.2-tiny", "--out", dir); code != 0 {
		t.Fatalf("synth: exit %d: %s", code, stderr)
	}
	js := filepath.Join(t.TempDir(), "bench.json")
	out, stderr, code := run(t, "bench", "decode", "--model-dir", dir, "--prompt-len", "40", "--tokens", "6", "--slots", "2", "--json", js)
	if code != 0 {
		t.Fatalf("bench: exit %d: %s", code, stderr)
	}
	if !strings.Contains(out, "tok/s per user") {
		t.Errorf("bench printed no throughput:\n%s", out)
	}
	data, err := os.ReadFile(js)
	if err != nil {
		t.Fatal(err)
	}
	var r struct {
		Slots, Steps int
		Tok          float64 `json:"tokens_per_second"`
	}
	if err := json.Unmarshal(data, &r); err != nil {
		t.Fatal(err)
	}
	// 6 tokens per slot, the first from prefill: 5 greedy steps.
	if r.Slots != 2 || r.Steps != 5 || !(r.Tok > 0) {
		t.Errorf("bench result %+v", r)
	}
	if _, _, code := run(t, "bench", "decode", "--model-dir", dir, "--slots", "0"); code != 2 {
		t.Errorf("--slots 0: exit %d, want 2", code)
	}

	// Imported contexts with MTP: every timed step verifies a draft per
	// slot, and the floor counts two rows through the main layers.
	js = filepath.Join(t.TempDir(), "ctx.json")
	args := []string{"bench", "decode", "--device", "cpu", "--model-dir", dir, "--context", "300", "--batches", "1", "--tokens", "8", "--json", js}
	if _, stderr, code := run(t, args...); code != 0 {
		t.Fatalf("bench --context: exit %d: %s", code, stderr)
	}
	out, stderr, code = run(t, append(args, "--mtp")...)
	if code != 0 {
		t.Fatalf("bench --context --mtp: exit %d: %s", code, stderr)
	}
	if !strings.Contains(out, "draft acceptance") {
		t.Errorf("bench --context --mtp printed no MTP line:\n%s", out)
	}
	data, err = os.ReadFile(js)
	if err != nil {
		t.Fatal(err)
	}
	var cr struct {
		Rows []struct {
			MTP           bool    `json:"mtp"`
			TokensPerStep float64 `json:"tokens_per_step"`
			FloorBytes    int64   `json:"floor_bytes"`
		} `json:"contexts"`
	}
	if err := json.Unmarshal(data, &cr); err != nil {
		t.Fatal(err)
	}
	if len(cr.Rows) != 1 || !cr.Rows[0].MTP || cr.Rows[0].TokensPerStep < 1 || cr.Rows[0].TokensPerStep > 2 {
		t.Errorf("bench --context --mtp result %+v", cr.Rows)
	}

	// --same-rows: the slots decode the same tokens (the bench fails if
	// they part), and two slots' floor is one slot's weights plus two
	// slots' caches.
	args = []string{"bench", "decode", "--device", "cpu", "--model-dir", dir, "--context", "300", "--batches", "1,2", "--tokens", "6", "--same-rows", "--json", js}
	if out, stderr, code := run(t, args...); code != 0 || !strings.Contains(out, "same rows:") {
		t.Fatalf("bench --same-rows: exit %d: %s\n%s", code, stderr, out)
	}
	data, err = os.ReadFile(js)
	if err != nil {
		t.Fatal(err)
	}
	var sr struct {
		Same bool `json:"same_rows"`
		Rows []struct {
			Slots      int   `json:"slots"`
			FloorBytes int64 `json:"floor_bytes"`
			CacheBytes int64 `json:"floor_cache_bytes"`
		} `json:"contexts"`
	}
	if err := json.Unmarshal(data, &sr); err != nil {
		t.Fatal(err)
	}
	if !sr.Same || len(sr.Rows) != 2 || sr.Rows[1].Slots != 2 || sr.Rows[1].CacheBytes != 2*sr.Rows[0].CacheBytes ||
		sr.Rows[1].FloorBytes-sr.Rows[1].CacheBytes != sr.Rows[0].FloorBytes-sr.Rows[0].CacheBytes {
		t.Errorf("bench --same-rows result %+v", sr)
	}
	// Two slots of their own states (the default), and of one state
	// (--one-state, the bench before session 58: said in the header and
	// the JSON).
	for _, one := range []bool{false, true} {
		args := []string{"bench", "decode", "--device", "cpu", "--model-dir", dir, "--context", "300", "--batches", "2", "--tokens", "6", "--json", js}
		if one {
			args = append(args, "--one-state")
		}
		out, stderr, code := run(t, args...)
		if code != 0 || strings.Contains(out, "one state:") != one {
			t.Fatalf("bench --batches 2 (--one-state %v): exit %d: %s\n%s", one, code, stderr, out)
		}
		data, err := os.ReadFile(js)
		if err != nil {
			t.Fatal(err)
		}
		var st struct {
			One  bool `json:"one_state"`
			Rows []struct {
				Slots int `json:"slots"`
			} `json:"contexts"`
		}
		if err := json.Unmarshal(data, &st); err != nil {
			t.Fatal(err)
		}
		if st.One != one || len(st.Rows) != 1 || st.Rows[0].Slots != 2 {
			t.Errorf("bench --batches 2 (--one-state %v) result %+v", one, st)
		}
	}
	if _, stderr, code := run(t, "bench", "decode", "--device", "cpu", "--model-dir", dir, "--same-rows"); code != 2 || !strings.Contains(stderr, "--same-rows needs --context") {
		t.Errorf("--same-rows without --context: exit %d: %s", code, stderr)
	}
	if _, stderr, code := run(t, "bench", "decode", "--device", "cpu", "--model-dir", dir, "--context", "300", "--same-rows", "--temperature", "0.7"); code != 2 || !strings.Contains(stderr, "greedy") {
		t.Errorf("--same-rows with --temperature: exit %d: %s", code, stderr)
	}
}

// A newcomer's slips get the real cause and a hint, exit 2, and no help
// page dump.
func TestNewcomerErrors(t *testing.T) {
	tests := []struct {
		args []string
		want []string
	}{
		{[]string{"decod"}, []string{`unknown command "decod"`, "did you mean decode?"}},
		{[]string{"bench", "decod"}, []string{`unknown command "decod"`, "did you mean decode?"}},
		{[]string{"config", "chek"}, []string{"did you mean check?"}},
		{[]string{"xyzzy"}, []string{`unknown command "xyzzy"`, "--help"}},
		{[]string{"bench", "decode"}, []string{"bench decode needs --model-dir", "tilert synth"}},
		{[]string{"generate", "--model-dir", "/nope", "--prompt", "hi"}, []string{"--model-dir /nope: no such directory"}},
		{[]string{"bench", "decode", "--model-dir", "/nope"}, []string{"--model-dir /nope: no such directory"}},
		{[]string{"generate", "--model-dir", "/nope", "--prompt", "hi", "--device", "tpu"}, []string{`unknown --device "tpu"`, "auto"}},
	}
	for _, tc := range tests {
		out, stderr, code := run(t, tc.args...)
		if code != 2 {
			t.Errorf("%v: exit %d, want 2 (stderr %q)", tc.args, code, stderr)
		}
		for _, w := range tc.want {
			if !strings.Contains(stderr, w) {
				t.Errorf("%v: stderr %q lacks %q", tc.args, stderr, w)
			}
		}
		if strings.Contains(out+stderr, "USAGE:") {
			t.Errorf("%v: printed a help page instead of an error", tc.args)
		}
	}
}

// The container files' command lines (Dockerfile CMD, deploy/compose.yaml
// services) are tilert command lines: each names a subcommand and flags it
// takes, with values that parse. CI cannot build the image where no
// container engine runs (.ci/run says so); this keeps the files honest.
func TestContainerCommandsParse(t *testing.T) {
	var lines [][]string
	docker, err := os.ReadFile("Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	compose, err := os.ReadFile("deploy/compose.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, re := range []struct {
		src []byte
		re  *regexp.Regexp
	}{
		{docker, regexp.MustCompile(`(?m)^CMD (\[.*\])$`)},
		{compose, regexp.MustCompile(`(?m)^\s+command: (\[.*\])$`)},
	} {
		for _, m := range re.re.FindAllSubmatch(re.src, -1) {
			var args []string
			if err := json.Unmarshal(m[1], &args); err != nil {
				t.Fatalf("%s: %v", m[0], err)
			}
			lines = append(lines, args)
		}
	}
	if len(lines) != 4 {
		t.Fatalf("found %d command lines (Dockerfile CMD + 3 compose services), want 4", len(lines))
	}
	if !strings.Contains(string(docker), `ENTRYPOINT ["/usr/local/bin/tilert"]`) {
		t.Error("the Dockerfile's entrypoint is not tilert")
	}
	for _, args := range lines {
		app := newApp()
		var ran string
		var stub func([]*cli.Command)
		stub = func(cmds []*cli.Command) {
			for _, c := range cmds {
				name := c.Name
				c.Action = func(*cli.Context) error { ran = name; return nil }
				stub(c.Subcommands)
			}
		}
		stub(app.Commands)
		var errb bytes.Buffer
		app.ErrWriter = &errb
		if err := app.Run(append([]string{"tilert"}, args...)); err != nil || ran != args[0] {
			t.Errorf("%v: ran %q, err %v %s", args, ran, err, errb.String())
		}
	}
}

// TestDocsRelativeLinks keeps the README's and docs/'s relative links pointing at files that exist: benchmark
// history moves between the README and docs/BENCHMARKS.md, and a link copied across keeps the wrong base.
func TestDocsRelativeLinks(t *testing.T) {
	files := []string{"README.md"}
	for _, pat := range []string{"docs/*.md", "docs/measured/*/README.md"} {
		m, err := filepath.Glob(pat)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, m...)
	}
	link := regexp.MustCompile(`\]\(([^)#\s]+)(#[^)\s]*)?\)`)
	checked := 0
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range link.FindAllStringSubmatch(string(b), -1) {
			p := m[1]
			if strings.Contains(p, "://") || strings.HasPrefix(p, "mailto:") {
				continue
			}
			checked++
			if _, err := os.Stat(filepath.Join(filepath.Dir(f), p)); err != nil {
				t.Errorf("%s links to %s, which does not exist relative to the file (fix the path or the link's base)", f, p)
			}
		}
	}
	if checked < 50 {
		t.Fatalf("only %d relative links found: the pattern no longer matches the docs", checked)
	}
}
