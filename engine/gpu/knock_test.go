package gpu

import (
	"reflect"
	"testing"
)

func TestKnockOut(t *testing.T) {
	op := func(name string, after bool) gop { return gop{name: name, afterPrev: after} }
	gemv := gop{name: "gemvFP8", shape: [3]int{7168, 2048, 1}}
	run := []gop{
		op("rmsnorm", false), gemv, op("fork", false), op("scores", false), op("topK", true),
		op("unfork", false), op("join", false), op("rmsnorm", false),
	}
	names := func(r []gop) []string {
		var s []string
		for _, o := range r {
			s = append(s, opKey(o))
		}
		return s
	}
	for _, tc := range []struct {
		key  string
		want []string
	}{
		{"rmsnorm", []string{"gemvFP8 7168x2048x1", "fork", "scores", "topK", "unfork", "join"}},
		{"gemvFP8 7168x2048x1", []string{"rmsnorm", "fork", "scores", "topK", "unfork", "join", "rmsnorm"}},
		// a pair goes together, whichever half is asked for
		{"scores", []string{"rmsnorm", "gemvFP8 7168x2048x1", "fork", "unfork", "join", "rmsnorm"}},
		{"topK", []string{"rmsnorm", "gemvFP8 7168x2048x1", "fork", "unfork", "join", "rmsnorm"}},
		// forks and joins are never left out
		{"fork", names(run)},
	} {
		if got := names(knockOut(run, tc.key)); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("knockOut(%q) = %v, want %v", tc.key, got, tc.want)
		}
	}
	if got, want := knockKeys([][]gop{run, {gemv, op("moeRoute", false)}}),
		[]string{"rmsnorm", "gemvFP8 7168x2048x1", "scores", "topK", "moeRoute"}; !reflect.DeepEqual(got, want) {
		t.Errorf("knockKeys = %v, want %v", got, want)
	}
}
