package converter

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/tilert-go/tilert/weights"
)

// damage copies a converted directory and applies fn to the copy.
func damage(t *testing.T, good string, fn func(t *testing.T, dir string, m *weights.Manifest)) string {
	t.Helper()
	dir := copyDir(t, good)
	m, err := weights.ReadManifest(dir)
	if err != nil {
		t.Fatal(err)
	}
	fn(t, dir, m)
	return dir
}

func TestVerifyRefuses(t *testing.T) {
	good, _ := convertTo(t, presetDir(t, "deepseek-v3.2-tiny"), func(o *Options) { o.Devices = 2 })
	if err := weights.Verify(good); err != nil {
		t.Fatalf("%+v", err)
	}
	m, _ := weights.ReadManifest(good)
	entry := func(name string) *weights.Entry {
		for i := range m.Tensors {
			if m.Tensors[i].Name == name {
				return &m.Tensors[i]
			}
		}
		t.Fatalf("no entry %s", name)
		return nil
	}
	const oProj = "model.layers.1.self_attn.o_proj.weight"
	o := entry(oProj)
	flip := func(t *testing.T, dir string, e *weights.Entry) {
		p := filepath.Join(dir, e.Shard)
		data, _ := os.ReadFile(p)
		data[e.Offset+e.Bytes/2] ^= 0x40
		os.WriteFile(p, data, 0o644)
	}
	rewrite := func(t *testing.T, dir string, fn func(m map[string]any)) {
		editJSON(t, filepath.Join(dir, weights.ManifestFile), fn)
	}
	for _, tc := range []struct {
		name       string
		fn         func(t *testing.T, dir string, m *weights.Manifest)
		structural bool // found without checksums (so the loader refuses it at Open)
		want       []string
	}{
		{"flipped byte", func(t *testing.T, dir string, m *weights.Manifest) { flip(t, dir, o) }, false,
			[]string{o.Shard, oProj, "checksum"}},
		{"flipped byte in an expert stack", func(t *testing.T, dir string, m *weights.Manifest) {
			flip(t, dir, entry(weights.ExpertStackName(2, 1, "down_proj")))
		}, false, []string{weights.ExpertStackName(2, 1, "down_proj"), "checksum"}},
		{"flipped scale", func(t *testing.T, dir string, m *weights.Manifest) { flip(t, dir, entry(weights.ScaleNameOf(oProj))) }, false,
			[]string{weights.ScaleNameOf(oProj), "checksum"}},
		{"truncated shard", func(t *testing.T, dir string, m *weights.Manifest) {
			p := filepath.Join(dir, o.Shard)
			st, _ := os.Stat(p)
			os.Truncate(p, st.Size()-1)
		}, true, []string{o.Shard, "truncated"}},
		{"missing shard", func(t *testing.T, dir string, m *weights.Manifest) { os.Remove(filepath.Join(dir, o.Shard)) }, true,
			[]string{o.Shard, "missing"}},
		{"no manifest", func(t *testing.T, dir string, m *weights.Manifest) {
			os.Remove(filepath.Join(dir, weights.ManifestFile))
		}, true,
			[]string{weights.ManifestFile, "missing", "tilert convert"}},
		{"tensor dropped from the manifest", func(t *testing.T, dir string, m *weights.Manifest) {
			rewrite(t, dir, func(m map[string]any) {
				ts := m["tensors"].([]any)
				for i, e := range ts {
					if e.(map[string]any)["name"] == oProj {
						m["tensors"] = append(ts[:i:i], ts[i+1:]...)
						m["total_bytes"] = m["total_bytes"].(float64) - float64(o.Bytes)
					}
				}
			})
		}, true, []string{oProj, "missing"}},
		{"wrong shape in the manifest", func(t *testing.T, dir string, m *weights.Manifest) {
			rewrite(t, dir, func(m map[string]any) {
				for _, e := range m["tensors"].([]any) {
					if e := e.(map[string]any); e["name"] == oProj {
						e["shape"] = []int{int(o.Shape[1]), int(o.Shape[0])}
					}
				}
			})
		}, true, []string{oProj}},
		{"other layout version", func(t *testing.T, dir string, m *weights.Manifest) {
			rewrite(t, dir, func(m map[string]any) { m["layout_version"] = weights.LayoutVersion + 1 })
		}, true, []string{"layout version", "convert the checkpoint again"}},
		{"devices changed", func(t *testing.T, dir string, m *weights.Manifest) {
			rewrite(t, dir, func(m map[string]any) { m["devices"] = 1 })
		}, true, []string{weights.ExpertStackName(1, 0, "gate_proj")}},
		{"tokenizer changed", func(t *testing.T, dir string, m *weights.Manifest) {
			os.WriteFile(filepath.Join(dir, "tokenizer.json"), []byte("{}"), 0o644)
		}, true, []string{"tokenizer.json", "checksum"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := damage(t, good, tc.fn)
			wantErr(t, weights.Verify(dir), tc.want...)
			_, _, err := weights.OpenWeights(dir)
			if tc.structural {
				wantErr(t, err, tc.want...)
				return
			}
			// Checksum damage: Open is structural only; the tensor's first read refuses it.
			if err != nil {
				t.Fatalf("%+v", err)
			}
			if err := weights.VerifyWith(dir, weights.VerifyOptions{}); err != nil {
				t.Errorf("structural verify: %v", err)
			}
		})
	}
}

func TestGetRefusesCorruptTensor(t *testing.T) {
	good, _ := convertTo(t, presetDir(t, "glm-5-tiny"), nil)
	const name = "model.layers.2.mlp.experts.5.up_proj.weight"
	dir := damage(t, good, func(t *testing.T, dir string, m *weights.Manifest) {
		for _, e := range m.Tensors {
			if e.Name == weights.ExpertStackName(2, 0, "up_proj") {
				p := filepath.Join(dir, e.Shard)
				data, _ := os.ReadFile(p)
				data[e.Offset] ^= 1
				os.WriteFile(p, data, 0o644)
			}
		}
	})
	w, _, err := weights.OpenWeights(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer w.(*weights.Dir).Close()
	if _, err := w.Get("model.layers.2.self_attn.o_proj.weight"); err != nil {
		t.Errorf("undamaged tensor: %v", err)
	}
	_, err = w.Get(name)
	wantErr(t, err, weights.ExpertStackName(2, 0, "up_proj"), "checksum")
}
