package converter

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"
)

// Progress reports conversion progress in bytes: a redrawn bar on a terminal, a log line every
// tenth of the work (or every 30 s) otherwise. Use Update as Options.Progress.
type Progress struct {
	w     io.Writer
	tty   bool
	mu    sync.Mutex
	start time.Time
	last  time.Time
	step  int // last logged tenth
	drawn bool
}

// NewProgress reports to f, drawing a bar when f is a terminal.
func NewProgress(f *os.File) *Progress {
	return &Progress{w: f, tty: IsTerminal(f), start: time.Now()}
}

// IsTerminal reports whether f is a character device (a terminal), not a file or pipe.
func IsTerminal(f *os.File) bool {
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// Update records done of total bytes.
func (p *Progress) Update(done, total int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := time.Now()
	el := now.Sub(p.start).Seconds()
	rate := 0.0
	if el > 0 {
		rate = float64(done) / 1e9 / el
	}
	frac := 1.0
	if total > 0 {
		frac = float64(done) / float64(total)
	}
	if p.tty {
		if now.Sub(p.last) < 100*time.Millisecond && done < total {
			return
		}
		p.last = now
		const width = 30
		n := int(frac * width)
		fmt.Fprintf(p.w, "\r[%s%s] %3.0f%% %.2f/%.2f GB %.2f GB/s ETA %s   ",
			strings.Repeat("=", n), strings.Repeat(" ", width-n), frac*100, float64(done)/1e9, float64(total)/1e9, rate, eta(done, total, rate))
		p.drawn = true
		return
	}
	tenth := int(frac * 10)
	if tenth > p.step || now.Sub(p.last) >= 30*time.Second {
		p.step, p.last = tenth, now
		slog.Info("convert: progress", "done_bytes", done, "total_bytes", total, "percent", int(frac*100),
			"gb_per_s", fmt.Sprintf("%.2f", rate), "eta", eta(done, total, rate))
	}
}

// eta is the time left at rate GB/s, to the second ("--" before the
// first bytes, "0s" when done).
func eta(done, total int64, rate float64) string {
	switch {
	case done >= total:
		return "0s"
	case rate <= 0:
		return "--"
	}
	return (time.Duration(float64(total-done) / 1e9 / rate * float64(time.Second))).Round(time.Second).String()
}

// Finish ends the bar's line.
func (p *Progress) Finish() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.tty && p.drawn {
		fmt.Fprintln(p.w)
		p.drawn = false
	}
}
