package generatecmd

import "testing"

func TestPrintable(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"plain text\nand\ttab", "plain text\nand\ttab"},
		{"bell\a esc\x1b[2J", `bell\u0007 esc\u001b[2J`},
		{"bad \xff utf8", `bad \xff utf8`},
		{"del\x7f", `del\u007f`},
		{"héllo 世界", "héllo 世界"},
	} {
		if got := printable(tc.in); got != tc.want {
			t.Errorf("printable(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}
