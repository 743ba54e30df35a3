package converter

import (
	"context"
	"flag"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/model/synth"
	"github.com/tilert-go/tilert/weights"
)

var update = flag.Bool("update", false, "rewrite golden files under testdata/")

var presets = []string{"deepseek-v3.2-tiny", "glm-5-tiny"}

var (
	presetMu   sync.Mutex
	presetDirs = map[string]string{}
	testRoot   string
)

func TestMain(m *testing.M) {
	var err error
	if testRoot, err = os.MkdirTemp("", "tilert-convert-test-"); err != nil {
		panic(err)
	}
	slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
	code := m.Run()
	os.RemoveAll(testRoot)
	os.Exit(code)
}

// presetDir writes a synthetic checkpoint once per test run; tests must not modify it (copy it
// with copyDir first).
func presetDir(t testing.TB, name string) string {
	t.Helper()
	presetMu.Lock()
	defer presetMu.Unlock()
	if d, ok := presetDirs[name]; ok {
		return d
	}
	dir := filepath.Join(testRoot, "src-"+name)
	if err := synth.Write(name, dir, 0, nil); err != nil {
		t.Fatalf("synth %s: %v", name, err)
	}
	presetDirs[name] = dir
	return dir
}

// copyDir copies a checkpoint directory (flat) so a test can damage it.
func copyDir(t testing.TB, from string) string {
	t.Helper()
	to := filepath.Join(t.TempDir(), "ckpt")
	if err := os.MkdirAll(to, 0o755); err != nil {
		t.Fatal(err)
	}
	ents, err := os.ReadDir(from)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		data, err := os.ReadFile(filepath.Join(from, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(to, e.Name()), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return to
}

// convertTo converts src into a fresh directory with small shards so several are written.
func convertTo(t testing.TB, src string, mod func(*Options)) (string, *Summary) {
	t.Helper()
	out := filepath.Join(t.TempDir(), "out")
	o := Options{ModelDir: src, SaveDir: out, Devices: 1, AppendMTP: true, MaxShardBytes: 3 << 20, ChunkBytes: 64 << 10}
	if mod != nil {
		mod(&o)
	}
	s, err := Convert(context.Background(), o)
	if err != nil {
		t.Fatalf("convert %s: %+v", src, err)
	}
	return out, s
}

// wantErr checks that err is non-nil and its message (with hints) holds every fragment.
func wantErr(t testing.TB, err error, fragments ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("no error, want one containing %q", fragments)
	}
	msg := err.Error() + " " + strings.Join(errors.GetAllHints(err), " ")
	for _, f := range fragments {
		if !strings.Contains(msg, f) {
			t.Errorf("error %q (hints %q) does not contain %q", err.Error(), errors.GetAllHints(err), f)
		}
	}
}

// noOutput checks that nothing a loader accepts was left at out.
func noOutput(t testing.TB, out string) {
	t.Helper()
	if _, err := os.Stat(out); !os.IsNotExist(err) {
		t.Errorf("%s exists after a failed conversion (stat err %v)", out, err)
	}
	if err := weights.Verify(out); err == nil {
		t.Errorf("Verify(%s) accepted a failed conversion", out)
	}
	if _, _, err := weights.OpenWeights(out); err == nil {
		t.Errorf("OpenWeights(%s) accepted a failed conversion", out)
	}
	p := out + weights.PartialSuffix
	if _, err := os.Stat(p); err == nil {
		if err := weights.Verify(p); err == nil {
			t.Errorf("Verify accepted the partial directory %s", p)
		}
		if _, _, err := weights.OpenWeights(p); err == nil {
			t.Errorf("OpenWeights accepted the partial directory %s", p)
		}
	}
}
