package converter

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"

	"github.com/tilert-go/tilert/weights"
)

// exitFS makes the process die (SIGKILL itself) after some bytes were written, like a crash or
// an OOM kill: no deferred cleanup runs.
type exitFS struct {
	OSFS
	after   int64
	file    string // when set, die on the first write to this file instead
	mu      sync.Mutex
	written int64
}

type exitFile struct {
	WFile
	fs   *exitFS
	name string
}

func (f *exitFS) Create(path string) (WFile, error) {
	w, err := f.OSFS.Create(path)
	return &exitFile{w, f, filepath.Base(path)}, err
}

func (f *exitFile) Write(p []byte) (int, error) {
	if f.die(p) {
		f.WFile.Write(p[:len(p)/2])
		syscall.Kill(os.Getpid(), syscall.SIGKILL)
	}
	return f.WFile.Write(p)
}

func (f *exitFile) WriteAt(p []byte, off int64) (int, error) {
	if f.die(p) {
		f.WFile.WriteAt(p[:len(p)/2], off)
		syscall.Kill(os.Getpid(), syscall.SIGKILL)
	}
	return f.WFile.WriteAt(p, off)
}

func (f *exitFile) die(p []byte) bool {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	f.fs.written += int64(len(p))
	return f.fs.file == "" && f.fs.written > f.fs.after || f.fs.file == f.name
}

// TestCrashHelper is the child of TestKilledMidRun; it does nothing unless asked to.
func TestCrashHelper(t *testing.T) {
	src, out := os.Getenv("TILERT_CRASH_SRC"), os.Getenv("TILERT_CRASH_OUT")
	if src == "" {
		t.Skip("child process of TestKilledMidRun")
	}
	after, _ := strconv.ParseInt(os.Getenv("TILERT_CRASH_AFTER"), 10, 64)
	_, err := Convert(context.Background(), Options{ModelDir: src, SaveDir: out, AppendMTP: true, Force: true,
		MaxShardBytes: 3 << 20, ChunkBytes: 64 << 10, FS: &exitFS{after: after, file: os.Getenv("TILERT_CRASH_FILE")}})
	t.Fatalf("conversion survived the crash point: %v", err)
}

// TestKilledMidRun kills a converting process at several points: nothing at OUT is accepted (or,
// with --force, the previous output is untouched), and a re-run succeeds.
func TestKilledMidRun(t *testing.T) {
	src := presetDir(t, "deepseek-v3.2-tiny")
	old, _ := convertTo(t, presetDir(t, "glm-5-tiny"), nil)
	for _, at := range []struct {
		after int64
		file  string
	}{{0, ""}, {1 << 20, ""}, {4 << 20, ""}, {0, "tokenizer.json"}, {0, weights.ManifestFile}} {
		after := at.after
		for _, existing := range []bool{false, true} {
			out := filepath.Join(t.TempDir(), "out")
			if existing {
				if err := os.Rename(copyDir(t, old), out); err != nil {
					t.Fatal(err)
				}
			}
			cmd := exec.Command(os.Args[0], "-test.run=^TestCrashHelper$")
			cmd.Env = append(os.Environ(), "TILERT_CRASH_SRC="+src, "TILERT_CRASH_OUT="+out, "TILERT_CRASH_AFTER="+strconv.FormatInt(after, 10), "TILERT_CRASH_FILE="+at.file)
			outp, err := cmd.CombinedOutput()
			if ee, ok := err.(*exec.ExitError); !ok || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
				t.Fatalf("after %d: child was not killed: %v\n%s", after, err, outp)
			}
			if _, err := os.Stat(out + weights.PartialSuffix); err != nil {
				t.Errorf("after %d: no partial directory left: %v", after, err)
			}
			if existing {
				if err := weights.Verify(out); err != nil {
					t.Errorf("after %d: previous output damaged: %v", after, err)
				}
				if m, _ := weights.ReadManifest(out); m == nil || m.ModelType != "glm_moe_dsa" {
					t.Errorf("after %d: previous output replaced", after)
				}
			} else {
				noOutput(t, out)
			}
			if _, err := Convert(context.Background(), Options{ModelDir: src, SaveDir: out, AppendMTP: true, Force: true}); err != nil {
				t.Fatalf("after %d: re-run: %+v", after, err)
			}
			if err := weights.Verify(out); err != nil {
				t.Fatal(err)
			}
		}
	}
}
