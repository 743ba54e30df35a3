// Command testsum reads `go test -json` on stdin and prints what a person
// wants from `make test`: one line per package (ok, FAIL, no tests), the
// output of every failed test, and at the end every skipped test with the
// reason it gave, grouped by reason, so nothing is skipped silently. It
// exits 1 when a test or a package failed.
//
//	go test -json ./... | go run ./internal/testsum
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"time"
)

// event is one line of `go test -json` (test2json).
type event struct {
	Action     string
	Package    string
	ImportPath string // build-output, build-fail
	Test       string
	Elapsed    float64
	Output     string
}

type key struct{ pkg, test string }

type summary struct {
	out      io.Writer
	output   map[key][]string // per test (and per package, test ""), until it ends
	skips    map[string][]string
	failed   []string
	packages int
	failPkgs int
	passed   int
}

func main() {
	s := &summary{out: os.Stdout, output: map[key][]string{}, skips: map[string][]string{}}
	if err := s.read(os.Stdin); err != nil {
		fmt.Fprintln(os.Stderr, "testsum:", err)
		os.Exit(2)
	}
	s.report()
	if len(s.failed) > 0 || s.failPkgs > 0 {
		os.Exit(1)
	}
}

func (s *summary) read(r io.Reader) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		line := sc.Bytes()
		var e event
		if json.Unmarshal(line, &e) != nil || e.Action == "" {
			fmt.Fprintln(s.out, string(line)) // a build error or other plain output
			continue
		}
		s.event(e)
	}
	return sc.Err()
}

func (s *summary) event(e event) {
	k := key{e.Package, e.Test}
	switch e.Action {
	case "build-output":
		fmt.Fprint(s.out, e.Output)
	case "build-fail":
		s.failPkgs++
		fmt.Fprintf(s.out, "FAIL\t%s [build failed]\n", e.ImportPath)
	case "output":
		s.output[k] = append(s.output[k], e.Output)
	case "pass", "fail", "skip":
		if e.Test == "" {
			s.endPackage(e)
			return
		}
		switch e.Action {
		case "pass":
			s.passed++
		case "fail":
			s.failed = append(s.failed, e.Package+" "+e.Test)
			fmt.Fprintf(s.out, "--- FAIL: %s %s (%.2fs)\n", e.Package, e.Test, e.Elapsed)
			for _, l := range s.output[k] {
				fmt.Fprint(s.out, "    "+l)
			}
		case "skip":
			s.skips[reason(s.output[k])] = append(s.skips[reason(s.output[k])], short(e.Package)+" "+e.Test)
		}
		delete(s.output, k)
	}
}

func (s *summary) endPackage(e event) {
	s.packages++
	k := key{e.Package, ""}
	out := s.output[k]
	delete(s.output, k)
	switch {
	case e.Action == "fail":
		s.failPkgs++
		fmt.Fprintf(s.out, "FAIL\t%s\t%.2fs\n", e.Package, e.Elapsed)
		for _, l := range out {
			if !strings.HasPrefix(l, "FAIL") && !strings.HasPrefix(l, "--- FAIL") {
				fmt.Fprint(s.out, "    "+l)
			}
		}
		// Tests that never ended (a timeout's panic names them and its
		// goroutine dump lands in their output): print what they wrote.
		var open []key
		for k := range s.output {
			if k.pkg == e.Package && k.test != "" {
				open = append(open, k)
			}
		}
		sort.Slice(open, func(i, j int) bool { return open[i].test < open[j].test })
		for _, k := range open {
			s.failed = append(s.failed, k.pkg+" "+k.test+" (never ended)")
			fmt.Fprintf(s.out, "--- NEVER ENDED: %s %s\n", k.pkg, k.test)
			for _, l := range s.output[k] {
				fmt.Fprint(s.out, "    "+l)
			}
			delete(s.output, k)
		}
	case e.Action == "skip":
		fmt.Fprintf(s.out, "?\t%s\t[no test files]\n", e.Package)
	default:
		fmt.Fprintf(s.out, "ok\t%s\t%s\n", e.Package, time.Duration(e.Elapsed*float64(time.Second)).Round(10*time.Millisecond))
	}
}

// reason is a skipped test's own message: its last output line that is
// not test2json's framing.
func reason(out []string) string {
	for i := len(out) - 1; i >= 0; i-- {
		l := strings.TrimSpace(out[i])
		if l == "" || strings.HasPrefix(l, "=== ") || strings.HasPrefix(l, "--- SKIP") {
			continue
		}
		// "file_test.go:12: message": keep the message.
		if f, msg, ok := strings.Cut(l, ": "); ok && strings.Contains(f, "_test.go:") {
			return msg
		}
		return l
	}
	return "(no reason given)"
}

func short(pkg string) string {
	if i := strings.Index(pkg, "/tilert/"); i >= 0 {
		return pkg[i+len("/tilert/"):]
	}
	return pkg
}

func (s *summary) report() {
	fmt.Fprintf(s.out, "\n== go test: %d packages, %d tests passed, %d failed, %d skipped\n",
		s.packages, s.passed, len(s.failed), s.skipped())
	for _, f := range s.failed {
		fmt.Fprintln(s.out, "   FAILED", f)
	}
	if s.skipped() == 0 {
		return
	}
	fmt.Fprintln(s.out, "== skipped Go tests, by reason:")
	reasons := make([]string, 0, len(s.skips))
	for r := range s.skips {
		reasons = append(reasons, r)
	}
	sort.Strings(reasons)
	for _, r := range reasons {
		ts := s.skips[r]
		sort.Strings(ts)
		fmt.Fprintf(s.out, "   %d: %s\n", len(ts), r)
		for _, t := range ts {
			fmt.Fprintln(s.out, "      "+t)
		}
	}
}

func (s *summary) skipped() int {
	n := 0
	for _, ts := range s.skips {
		n += len(ts)
	}
	return n
}
