package benchcmd

import (
	"bytes"
	"strings"
	"testing"

	"github.com/tilert-go/tilert/engine/gpu"
)

// The profile block prints each row's share of the graphs and how the
// shares add up against the graphs' time.
func TestReportRowProfile(t *testing.T) {
	for _, tc := range []struct {
		name  string
		ops   []gpu.OpTime
		graph float64
		want  []string
	}{
		{"serial", []gpu.OpTime{{Name: "gemvFP8 7168x16384x1", Count: 10, Bytes: 1 << 30, Us: 385.3, InGraphUs: 328.5}, {Name: "topK", Count: 10, Us: 142, InGraphUs: 180.7}}, 520,
			[]string{"in graph   328.5 us", "in graph   180.7 us", "add up to 509 us of the graphs' 520 us (98%"}},
		{"overlapped", []gpu.OpTime{{Name: "gemvFP8 8192x1536x1", Count: 10, Us: 107.9, InGraphUs: -19.1}, {Name: "absorbQ", Count: 10, Us: 97.2, InGraphUs: 31.9}}, 200,
			[]string{"in graph   -19.1 us", "add up to 13 us of the graphs' 200 us (6%"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b bytes.Buffer
			reportRow(&b, ContextResult{}, ContextRow{Context: 8192, Slots: 1, Profile: &gpu.StepProfile{Ops: tc.ops, GraphUs: tc.graph}}, false)
			for _, w := range tc.want {
				if !strings.Contains(b.String(), w) {
					t.Errorf("report lacks %q:\n%s", w, b.String())
				}
			}
		})
	}
}
