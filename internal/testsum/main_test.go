package main

import (
	"bytes"
	"strings"
	"testing"
)

// A package that fails while a test is still running (go test's -timeout
// panic) prints that test's output, the panic's goroutine dump included,
// and counts it as failed; a package whose tests all ended prints none.
func TestNeverEndedTests(t *testing.T) {
	for _, c := range []struct {
		name, in string
		want     []string
		failed   int
	}{
		{"timeout", `{"Action":"run","Package":"p","Test":"TestHang"}
{"Action":"output","Package":"p","Test":"TestHang","Output":"=== RUN   TestHang\n"}
{"Action":"output","Package":"p","Test":"TestHang","Output":"panic: test timed out after 30m0s\n"}
{"Action":"output","Package":"p","Test":"TestHang","Output":"goroutine 7 [chan receive]:\n"}
{"Action":"fail","Package":"p","Elapsed":1800}
`, []string{"FAIL\tp\t1800.00s", "--- NEVER ENDED: p TestHang", "panic: test timed out", "goroutine 7 [chan receive]"}, 1},
		{"ended", `{"Action":"run","Package":"p","Test":"TestOK"}
{"Action":"output","Package":"p","Test":"TestOK","Output":"=== RUN   TestOK\n"}
{"Action":"pass","Package":"p","Test":"TestOK","Elapsed":0.1}
{"Action":"pass","Package":"p","Elapsed":0.2}
`, []string{"ok\tp\t200ms"}, 0},
	} {
		var out bytes.Buffer
		s := &summary{out: &out, output: map[key][]string{}, skips: map[string][]string{}}
		if err := s.read(strings.NewReader(c.in)); err != nil {
			t.Fatal(err)
		}
		for _, w := range c.want {
			if !strings.Contains(out.String(), w) {
				t.Errorf("%s: output lacks %q:\n%s", c.name, w, out.String())
			}
		}
		if strings.Contains(out.String(), "NEVER ENDED") != (c.failed > 0) || len(s.failed) != c.failed {
			t.Errorf("%s: %d failed (%v), want %d:\n%s", c.name, len(s.failed), s.failed, c.failed, out.String())
		}
	}
}
