package weights

import (
	"fmt"
	"testing"
)

func TestExpertPlacement(t *testing.T) {
	for _, tc := range []struct{ n, devices int }{{8, 1}, {8, 3}, {64, 8}, {5, 5}, {257, 8}} {
		seen := make([]int, tc.devices)
		for e := 0; e < tc.n; e++ {
			d, local := DeviceOfExpert(e, tc.devices, tc.n)
			if d < 0 || d >= tc.devices {
				t.Fatalf("n=%d devices=%d: expert %d on device %d", tc.n, tc.devices, e, d)
			}
			if first := FirstExpert(d, tc.devices, tc.n); e != first+local {
				t.Errorf("n=%d devices=%d: expert %d = first %d + local %d", tc.n, tc.devices, e, first, local)
			}
			if local != seen[d] {
				t.Errorf("n=%d devices=%d: expert %d has local index %d, want %d (contiguous)", tc.n, tc.devices, e, local, seen[d])
			}
			seen[d]++
		}
		for d, k := range seen {
			if k == 0 {
				t.Errorf("n=%d devices=%d: device %d holds no expert", tc.n, tc.devices, d)
			}
		}
	}
}

func TestNameParsers(t *testing.T) {
	for _, proj := range ExpertProjs {
		name := fmt.Sprintf("model.layers.3.mlp.experts.17.%s.weight", proj)
		l, e, p, ok := ParseExpertName(name)
		if !ok || l != 3 || e != 17 || p != proj {
			t.Errorf("ParseExpertName(%q) = %d %d %q %v", name, l, e, p, ok)
		}
	}
	for _, bad := range []string{"model.layers.3.mlp.experts.17.gate_proj.bias", "model.layers.3.mlp.experts.x.up_proj.weight",
		"model.layers.3.mlp.experts.1.fc.weight", "model.layers.03.mlp.experts.1.up_proj.weight"} {
		if _, _, _, ok := ParseExpertName(bad); ok {
			t.Errorf("ParseExpertName(%q) accepted", bad)
		}
	}
	if l, ok := IsKVBProj("model.layers.5.self_attn.kv_b_proj.weight"); !ok || l != 5 {
		t.Errorf("IsKVBProj = %d %v", l, ok)
	}
	if _, ok := IsKVBProj("model.layers.5.self_attn.kv_a_proj_with_mqa.weight"); ok {
		t.Error("IsKVBProj accepted kv_a_proj_with_mqa")
	}
	if l, ok := LayerOf("model.layers.12.input_layernorm.weight"); !ok || l != 12 {
		t.Errorf("LayerOf = %d %v", l, ok)
	}
	if got := CRCHex(0xbeef); got != "0000beef" {
		t.Errorf("CRCHex = %q", got)
	}
}
