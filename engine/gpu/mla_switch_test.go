package gpu

import "testing"

// The MLA decode variant the environment picks: tcf2 unless switched off or
// another variant is asked for.
func TestTCFSwitch(t *testing.T) {
	for _, c := range []struct {
		env   string
		other bool
		want  string
	}{
		{"", false, "2"},
		{"0", false, ""},
		{"", true, ""},
		{"1", false, "1"},
		{"1", true, "1"},
		{"8", false, "8"},
	} {
		if got := tcfSwitch(c.env, c.other); got != c.want {
			t.Errorf("tcfSwitch(%q, %v) = %q, want %q", c.env, c.other, got, c.want)
		}
	}
}
