package converter

import (
	"bytes"
	"log/slog"
	"os"
	"strings"
	"testing"
)

func TestProgressBar(t *testing.T) {
	var b bytes.Buffer
	p := &Progress{w: &b, tty: true}
	p.Update(0, 4e9)
	p.Update(1e9, 4e9) // within 100 ms of the last draw: skipped
	p.Update(4e9, 4e9) // the end is always drawn
	p.Finish()
	out := b.String()
	if !strings.HasPrefix(out, "\r[") || !strings.Contains(out, "100% 4.00/4.00 GB") || !strings.HasSuffix(out, "\n") {
		t.Errorf("bar output %q", out)
	}
	if strings.Contains(out, " 25%") {
		t.Errorf("bar redrawn faster than every 100 ms: %q", out)
	}
}

func TestProgressLogLines(t *testing.T) {
	var b bytes.Buffer
	old := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(&b, nil)))
	defer slog.SetDefault(old)
	f, err := os.CreateTemp(t.TempDir(), "log")
	if err != nil {
		t.Fatal(err)
	}
	p := NewProgress(f) // a file, not a terminal: log lines
	if p.tty {
		t.Fatal("a regular file detected as a terminal")
	}
	for done := int64(0); done <= 1000; done += 10 {
		p.Update(done, 1000)
	}
	p.Finish()
	lines := strings.Count(b.String(), "convert: progress")
	if lines != 11 {
		t.Errorf("%d log lines for 0..100%%, want one at the start and one per tenth (11):\n%s", lines, b.String())
	}
	if fi, _ := f.Stat(); fi.Size() != 0 {
		t.Errorf("log mode wrote %d bytes to the progress file", fi.Size())
	}
}

func TestProgressETA(t *testing.T) {
	for _, tc := range []struct {
		done, total int64
		rate        float64
		want        string
	}{
		{0, 4e9, 0, "--"},
		{1e9, 4e9, 1, "3s"},
		{1e9, 121e9, 2, "1m0s"},
		{4e9, 4e9, 2, "0s"},
	} {
		if got := eta(tc.done, tc.total, tc.rate); got != tc.want {
			t.Errorf("eta(%d, %d, %g) = %q, want %q", tc.done, tc.total, tc.rate, got, tc.want)
		}
	}
	var b bytes.Buffer
	old := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(&b, nil)))
	defer slog.SetDefault(old)
	p := &Progress{w: &b}
	p.Update(500, 1000)
	if !strings.Contains(b.String(), "eta=") || !strings.Contains(b.String(), "gb_per_s=") {
		t.Errorf("log line lacks rate or ETA: %s", b.String())
	}
}
