package converter

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/safetensors"
	"github.com/tilert-go/tilert/weights"
)

// editJSON rewrites a JSON object file through fn.
func editJSON(t *testing.T, path string, fn func(map[string]any)) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(data, &m); err != nil {
		t.Fatal(err)
	}
	fn(m)
	if data, err = json.Marshal(m); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
}

func shardOf(t *testing.T, dir, tensor string) string {
	t.Helper()
	idx, err := safetensors.ReadIndex(dir)
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(dir, idx.WeightMap[tensor])
}

func TestBadInput(t *testing.T) {
	const oProj = "model.layers.1.self_attn.o_proj.weight"
	for _, tc := range []struct {
		name   string
		break_ func(t *testing.T, dir string)
		mod    func(o *Options)
		want   []string
	}{
		{"missing tensor", func(t *testing.T, dir string) {
			editJSON(t, filepath.Join(dir, safetensors.IndexFile), func(m map[string]any) {
				delete(m["weight_map"].(map[string]any), oProj)
			})
		}, nil, []string{oProj, "missing"}},
		{"missing shard", func(t *testing.T, dir string) {
			os.Remove(shardOf(t, dir, oProj))
		}, nil, []string{filepath.Base(shardOf(t, presetDir(t, presets[0]), oProj)), "missing"}},
		{"shape mismatch", func(t *testing.T, dir string) {
			editJSON(t, filepath.Join(dir, "config.json"), func(m map[string]any) { m["q_lora_rank"] = 64 })
		}, nil, []string{"model.layers.0.self_attn.q_a_proj.weight", "shape", "config.json"}},
		{"unsupported block size", func(t *testing.T, dir string) {
			editJSON(t, filepath.Join(dir, "config.json"), func(m map[string]any) {
				m["quantization_config"].(map[string]any)["weight_block_size"] = []int{64, 64}
			})
		}, nil, []string{"config.json", "weight_block_size", "128"}},
		{"unsupported fp8 format", func(t *testing.T, dir string) {
			editJSON(t, filepath.Join(dir, "config.json"), func(m map[string]any) {
				m["quantization_config"].(map[string]any)["fmt"] = "e5m2"
			})
		}, nil, []string{"config.json", "fmt", "e5m2"}},
		{"truncated shard", func(t *testing.T, dir string) {
			p := shardOf(t, dir, oProj)
			st, _ := os.Stat(p)
			if err := os.Truncate(p, st.Size()-100); err != nil {
				t.Fatal(err)
			}
		}, nil, []string{filepath.Base(shardOf(t, presetDir(t, presets[0]), oProj)), "truncated"}},
		{"unreadable shard", func(t *testing.T, dir string) {
			p := shardOf(t, dir, oProj)
			os.Remove(p)
			if err := os.Mkdir(p, 0o755); err != nil { // a directory where the shard should be
				t.Fatal(err)
			}
		}, nil, []string{filepath.Base(shardOf(t, presetDir(t, presets[0]), oProj)), "not a regular file"}},
		{"model name mismatch", nil, func(o *Options) { o.ModelName = "glm-5" }, []string{"glm_moe_dsa", "deepseek_v32", "--model"}},
		{"too many devices", nil, func(o *Options) { o.Devices = 17 }, []string{"--devices 17", "16 routed experts"}},
		{"shard limit too small", nil, func(o *Options) { o.MaxShardBytes = 100 << 10 }, []string{"shard limit"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src := copyDir(t, presetDir(t, "deepseek-v3.2-tiny"))
			if tc.break_ != nil {
				tc.break_(t, src)
			}
			out := filepath.Join(t.TempDir(), "out")
			o := Options{ModelDir: src, SaveDir: out, AppendMTP: true, MaxShardBytes: 3 << 20}
			if tc.mod != nil {
				tc.mod(&o)
			}
			_, err := Convert(context.Background(), o)
			wantErr(t, err, tc.want...)
			noOutput(t, out)
		})
	}
}

// TestSourceChangesMidRun truncates a source shard while the converter streams it: the read
// error names the file and tensor, and nothing is published.
func TestSourceChangesMidRun(t *testing.T) {
	src := copyDir(t, presetDir(t, "glm-5-tiny"))
	victim := shardOf(t, src, "lm_head.weight")
	out := filepath.Join(t.TempDir(), "out")
	var once atomic.Bool
	_, err := Convert(context.Background(), Options{
		ModelDir: src, SaveDir: out, AppendMTP: true, MaxShardBytes: 3 << 20, ChunkBytes: 4096,
		Progress: func(done, total int64) {
			if once.CompareAndSwap(false, true) {
				if err := os.Truncate(victim, 4096); err != nil {
					t.Error(err)
				}
			}
		},
	})
	wantErr(t, err, filepath.Base(victim), "tensor", "truncated")
	noOutput(t, out)
}

// faultFS injects errors into the converter's writes.
type faultFS struct {
	OSFS
	failAfter  int64  // a Write fails once this many bytes were written (0: never)
	failWrite  string // a Write to a file whose name contains this fails
	written    atomic.Int64
	failSync   string // Sync of a file whose name contains this fails
	failRename bool
	failSwap   bool
	renames    atomic.Int32
}

type faultFile struct {
	WFile
	fs   *faultFS
	path string
}

func (f *faultFS) Create(path string) (WFile, error) {
	w, err := f.OSFS.Create(path)
	if err != nil {
		return nil, err
	}
	return &faultFile{WFile: w, fs: f, path: path}, nil
}

func (f *faultFile) Write(p []byte) (int, error) {
	if f.fs.failAfter > 0 && f.fs.written.Add(int64(len(p))) > f.fs.failAfter ||
		f.fs.failWrite != "" && strings.Contains(filepath.Base(f.path), f.fs.failWrite) {
		return 0, &os.PathError{Op: "write", Path: f.path, Err: syscall.ENOSPC}
	}
	return f.WFile.Write(p)
}

func (f *faultFile) WriteAt(p []byte, off int64) (int, error) {
	if _, err := f.Write(nil); err != nil { // the same fault rules
		return 0, err
	}
	if f.fs.failAfter > 0 && f.fs.written.Add(int64(len(p))) > f.fs.failAfter {
		return 0, &os.PathError{Op: "write", Path: f.path, Err: syscall.ENOSPC}
	}
	return f.WFile.WriteAt(p, off)
}

func (f *faultFile) Sync() error {
	if f.fs.failSync != "" && strings.Contains(filepath.Base(f.path), f.fs.failSync) {
		return &os.PathError{Op: "fsync", Path: f.path, Err: syscall.EIO}
	}
	return f.WFile.Sync()
}

func (f *faultFS) Rename(a, b string) error {
	f.renames.Add(1)
	if f.failRename {
		return &os.LinkError{Op: "rename", Old: a, New: b, Err: syscall.EXDEV}
	}
	return f.OSFS.Rename(a, b)
}

func (f *faultFS) Exchange(a, b string) error {
	if f.failSwap {
		return errors.ErrUnsupported
	}
	return f.OSFS.Exchange(a, b)
}

func TestWriteErrors(t *testing.T) {
	src := presetDir(t, "deepseek-v3.2-tiny")
	for _, tc := range []struct {
		name string
		fs   *faultFS
		want []string
	}{
		{"disk full mid-run", &faultFS{failAfter: 2 << 20}, []string{"no space left on device", "model-0000", ".safetensors: tensor"}},
		{"disk full on the manifest", &faultFS{failWrite: weights.ManifestFile}, []string{"no space left", weights.ManifestFile}},
		{"disk full on the tokenizer", &faultFS{failWrite: "tokenizer.json"}, []string{"no space left", "tokenizer.json"}},
		{"fsync of a shard", &faultFS{failSync: "model-00002"}, []string{"fsync", "model-00002", "input/output error"}},
		{"fsync of the manifest", &faultFS{failSync: weights.ManifestFile}, []string{"fsync", weights.ManifestFile}},
		{"final rename", &faultFS{failRename: true}, []string{"rename", weights.PartialSuffix}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "out")
			_, err := Convert(context.Background(), Options{ModelDir: src, SaveDir: out, AppendMTP: true, MaxShardBytes: 3 << 20, ChunkBytes: 64 << 10, FS: tc.fs})
			wantErr(t, err, tc.want...)
			noOutput(t, out)
			if _, err := os.Stat(out + weights.PartialSuffix); !os.IsNotExist(err) {
				t.Errorf("the partial directory was not removed after the error")
			}
		})
	}
}

// TestForceKeepsOldUntilComplete: a failing --force run leaves the previous output intact; a
// successful one replaces it, with and without the atomic swap.
func TestForceKeepsOldUntilComplete(t *testing.T) {
	ds, glm := presetDir(t, "deepseek-v3.2-tiny"), presetDir(t, "glm-5-tiny")
	out, _ := convertTo(t, ds, nil)

	_, err := Convert(context.Background(), Options{ModelDir: glm, SaveDir: out, AppendMTP: true})
	wantErr(t, err, "already exists", "--force")

	_, err = Convert(context.Background(), Options{ModelDir: glm, SaveDir: out, AppendMTP: true, Force: true, FS: &faultFS{failAfter: 1 << 20}})
	wantErr(t, err, "no space left")
	m, err := weights.ReadManifest(out)
	if err != nil || m.ModelType != "deepseek_v32" {
		t.Fatalf("old output damaged by a failed --force run: %v %v", m, err)
	}
	if err := weights.Verify(out); err != nil {
		t.Fatalf("old output no longer verifies: %+v", err)
	}

	for _, swap := range []bool{true, false} {
		fs := &faultFS{failSwap: !swap}
		src := map[bool]string{true: glm, false: ds}[swap]
		if _, err := Convert(context.Background(), Options{ModelDir: src, SaveDir: out, AppendMTP: true, Force: true, FS: fs}); err != nil {
			t.Fatalf("swap=%v: %+v", swap, err)
		}
		if err := weights.Verify(out); err != nil {
			t.Fatalf("swap=%v: %+v", swap, err)
		}
		m, _ := weights.ReadManifest(out)
		want := map[bool]string{true: "glm_moe_dsa", false: "deepseek_v32"}[swap]
		if string(m.ModelType) != want {
			t.Errorf("swap=%v: output is %s, want %s", swap, m.ModelType, want)
		}
		ents, _ := os.ReadDir(filepath.Dir(out))
		if len(ents) != 1 {
			t.Errorf("swap=%v: leftovers beside the output: %v", swap, ents)
		}
	}
}

// TestInterruptedRun: what a killed conversion leaves (a .partial directory, with or without a
// manifest) is refused by weights.Verify and the loader, and a re-run replaces it.
func TestInterruptedRun(t *testing.T) {
	src := presetDir(t, "deepseek-v3.2-tiny")
	done, _ := convertTo(t, src, nil)
	out := filepath.Join(t.TempDir(), "out")
	partial := out + weights.PartialSuffix
	if err := os.Rename(done, partial); err != nil {
		t.Fatal(err)
	}
	// Complete but never renamed (killed between the manifest and the rename).
	wantErr(t, weights.Verify(partial), "unfinished conversion")
	_, _, err := weights.OpenWeights(partial)
	wantErr(t, err, "unfinished conversion")
	// Killed before the manifest: even under the final name it is refused.
	if err := os.Remove(filepath.Join(partial, weights.ManifestFile)); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(partial, out); err != nil {
		t.Fatal(err)
	}
	wantErr(t, weights.Verify(out), weights.ManifestFile, "missing")
	os.Remove(out)

	if _, err := Convert(context.Background(), Options{ModelDir: src, SaveDir: out, AppendMTP: true}); err != nil {
		t.Fatalf("re-run after an interruption: %+v", err)
	}
	if err := weights.Verify(out); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(partial); !os.IsNotExist(err) {
		t.Errorf("stale %s still there", partial)
	}

	// A .partial directory holding files the converter did not write is left alone.
	out2 := filepath.Join(t.TempDir(), "out2")
	os.MkdirAll(out2+weights.PartialSuffix, 0o755)
	os.WriteFile(filepath.Join(out2+weights.PartialSuffix, "notes.txt"), []byte("mine"), 0o644)
	_, err = Convert(context.Background(), Options{ModelDir: src, SaveDir: out2, AppendMTP: true})
	wantErr(t, err, "notes.txt", "did not write")
	if _, err := os.Stat(filepath.Join(out2+weights.PartialSuffix, "notes.txt")); err != nil {
		t.Errorf("user file removed: %v", err)
	}
}

func TestCancel(t *testing.T) {
	src := presetDir(t, "glm-5-tiny")
	out := filepath.Join(t.TempDir(), "out")
	ctx, cancel := context.WithCancel(context.Background())
	_, err := Convert(ctx, Options{ModelDir: src, SaveDir: out, AppendMTP: true, ChunkBytes: 4096,
		Progress: func(done, total int64) {
			if done > total/2 {
				cancel()
			}
		}})
	wantErr(t, err, "context canceled")
	noOutput(t, out)
}
