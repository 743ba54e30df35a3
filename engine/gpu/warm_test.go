package gpu

import "testing"

func TestParseWarm(t *testing.T) {
	for _, c := range []struct {
		v      string
		want   warmSpec
		prefix int64
		bad    bool
	}{
		{v: "", want: warmSpec{}},
		{v: "0", want: warmSpec{}},
		{v: "25", want: warmSpec{pct: 25, period: 4096}, prefix: 1024},
		{v: "100,b=8", want: warmSpec{pct: 100, period: 4096, blocks: 8}, prefix: 4096},
		{v: "30,p=1024,b=264", want: warmSpec{pct: 30, period: 1024, blocks: 264}, prefix: 304},
		{v: "1,p=16", bad: true}, // less than a word a period
		{v: "101", bad: true},
		{v: "-5", bad: true},
		{v: "x", bad: true},
		{v: "25,b=0", bad: true},
		{v: "25,p=100", bad: true},
		{v: "25,q=1", bad: true},
		{v: "25,b", bad: true},
	} {
		got, err := parseWarm(c.v)
		switch {
		case c.bad && err == nil:
			t.Errorf("%q: took %+v, want an error", c.v, got)
		case !c.bad && err != nil:
			t.Errorf("%q: %v", c.v, err)
		case !c.bad && (got != c.want || got.pct > 0 && got.prefix() != c.prefix):
			t.Errorf("%q: %+v (prefix %d), want %+v (prefix %d)", c.v, got, got.prefix(), c.want, c.prefix)
		}
	}
	if sideCapFor(chainWarm, true, openSet{}, 1) != 0 {
		t.Error("the warm-up chain is capped")
	}
}
