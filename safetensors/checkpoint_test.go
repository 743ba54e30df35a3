package safetensors

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

func u8(name string, data ...byte) Tensor {
	return Tensor{TensorInfo{Name: name, DType: U8, Shape: []int64{int64(len(data))}}, data}
}

// shardedDir writes two shards and an index mapping a,b -> shard 1, c -> shard 2.
func shardedDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	s1, s2 := "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"
	if err := WriteFile(filepath.Join(dir, s1), []Tensor{u8("b", 2, 2), u8("a", 1)}, map[string]string{"format": "pt"}); err != nil {
		t.Fatal(err)
	}
	if err := WriteFile(filepath.Join(dir, s2), []Tensor{u8("c", 3, 3, 3)}, map[string]string{"format": "pt"}); err != nil {
		t.Fatal(err)
	}
	if err := WriteIndex(dir, map[string]string{"a": s1, "b": s1, "c": s2}, 6); err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestOpenDirSharded(t *testing.T) {
	dir := shardedDir(t)
	idx, err := ReadIndex(dir)
	if err != nil {
		t.Fatal(err)
	}
	if idx.Metadata["total_size"] != float64(6) || len(idx.WeightMap) != 3 {
		t.Errorf("index = %+v", idx)
	}
	c, err := OpenDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if got := c.Names(); !slices.Equal(got, []string{"a", "b", "c"}) {
		t.Errorf("Names = %v", got)
	}
	if len(c.Files()) != 2 || c.Dir() != dir {
		t.Errorf("Files %d Dir %q", len(c.Files()), c.Dir())
	}
	want := map[string][]byte{"a": {1}, "b": {2, 2}, "c": {3, 3, 3}}
	for name, w := range want {
		d, err := c.Data(name)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(d, w) {
			t.Errorf("%s = %v want %v", name, d, w)
		}
		info, f, ok := c.Lookup(name)
		if !ok || info.Name != name || f == nil || info.End-info.Begin != int64(len(w)) {
			t.Errorf("Lookup(%s) = %+v %v %v", name, info, f, ok)
		}
	}
	_, err = c.Data("zz")
	checkErr(t, err, dir, `"zz"`)
	if _, _, ok := c.Lookup("zz"); ok {
		t.Error("Lookup of a missing tensor succeeded")
	}
}

func TestOpenDirPlain(t *testing.T) {
	// Single model.safetensors wins over other files.
	dir := t.TempDir()
	if err := WriteFile(filepath.Join(dir, "model.safetensors"), []Tensor{u8("x", 1)}, nil); err != nil {
		t.Fatal(err)
	}
	if err := WriteFile(filepath.Join(dir, "other.safetensors"), []Tensor{u8("y", 1)}, nil); err != nil {
		t.Fatal(err)
	}
	c, err := OpenDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(c.Names(), []string{"x"}) {
		t.Errorf("Names = %v", c.Names())
	}
	c.Close()
	// Without it, every *.safetensors is read.
	if err := os.Remove(filepath.Join(dir, "model.safetensors")); err != nil {
		t.Fatal(err)
	}
	if err := WriteFile(filepath.Join(dir, "more.safetensors"), []Tensor{u8("z", 1)}, nil); err != nil {
		t.Fatal(err)
	}
	c, err = OpenDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(c.Names(), []string{"y", "z"}) {
		t.Errorf("Names = %v", c.Names())
	}
	c.Close()
	// The same tensor in two files is ambiguous.
	if err := WriteFile(filepath.Join(dir, "dup.safetensors"), []Tensor{u8("z", 2)}, nil); err != nil {
		t.Fatal(err)
	}
	_, err = OpenDir(dir)
	checkErr(t, err, `"z"`, "dup.safetensors", "more.safetensors")
	_, err = OpenDir(t.TempDir())
	checkErr(t, err, "no "+IndexFile)
}

func TestOpenDirBad(t *testing.T) {
	s1 := "model-00001-of-00002.safetensors"
	s2 := "model-00002-of-00002.safetensors"
	cases := []struct {
		name  string
		mut   func(t *testing.T, dir string)
		frags []string
	}{
		{"missing tensor in index", func(t *testing.T, dir string) {
			rewriteIndex(t, dir, func(m map[string]string) { m["d"] = s2 })
		}, []string{`"d"`, s2, "not stored"}},
		{"index points to missing shard", func(t *testing.T, dir string) {
			rewriteIndex(t, dir, func(m map[string]string) { m["e"] = "model-00003-of-00003.safetensors" })
		}, []string{`"e"`, "model-00003-of-00003.safetensors", "missing"}},
		{"shard deleted", func(t *testing.T, dir string) {
			os.Remove(filepath.Join(dir, s2))
		}, []string{`"c"`, s2}},
		{"truncated shard", func(t *testing.T, dir string) {
			p := filepath.Join(dir, s1)
			st, _ := os.Stat(p)
			if err := os.Truncate(p, st.Size()-1); err != nil {
				t.Fatal(err)
			}
		}, []string{s1, `"a"`, "past the end"}},
		{"shard outside dir", func(t *testing.T, dir string) {
			rewriteIndex(t, dir, func(m map[string]string) { m["a"] = "../x.safetensors" })
		}, []string{`"a"`, "../x.safetensors"}},
		{"bad index json", func(t *testing.T, dir string) {
			os.WriteFile(filepath.Join(dir, IndexFile), []byte("{"), 0o644)
		}, []string{IndexFile}},
		{"index without weight_map", func(t *testing.T, dir string) {
			os.WriteFile(filepath.Join(dir, IndexFile), []byte(`{"metadata":{}}`), 0o644)
		}, []string{"weight_map"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := shardedDir(t)
			tc.mut(t, dir)
			c, err := OpenDir(dir)
			if err == nil {
				c.Close()
			}
			checkErr(t, err, tc.frags...)
		})
	}
}

func rewriteIndex(t *testing.T, dir string, mut func(map[string]string)) {
	t.Helper()
	idx, err := ReadIndex(dir)
	if err != nil {
		t.Fatal(err)
	}
	mut(idx.WeightMap)
	data, _ := json.Marshal(idx)
	if err := os.WriteFile(filepath.Join(dir, IndexFile), data, 0o644); err != nil {
		t.Fatal(err)
	}
}
