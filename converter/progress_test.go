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
