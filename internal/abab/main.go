// Command abab reads the summary files of the device plans
// (docs/measured/next/plan.sh: a line per bench row, NAME then the
// environment it ran with, then the row) and prints each A/B/A/B the plans
// ran (abab: NAME-A, NAME-B, NAME-A2, NAME-B2) as one line: the default's
// and the variant's p50 twice, the two differences and the verdict the
// project's rule reads from them. A switch becomes a default only where it
// wins twice on a model and loses nowhere; a difference within the
// run-to-run spread of its own rows is neither.
//
//	go run ./internal/abab docs/measured/h200-2026-12-05-s34/callA/summary.txt
package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

// row is one bench row of a summary: its name, the environment it ran
// with, and its context, slots and p50 (ms).
type row struct {
	name, env    string
	ctx, slots   int
	p50          float64
	order, fileN int
}

// A bench row as plan.sh's bn writes it: NAME [VAR=value ...] then the
// row: context slots p50 p90 tok/s floor-GB floor-ms GB/s eff us/layer.
var rowRE = regexp.MustCompile(`^(\S+)((?:\s+[A-Z][A-Z0-9_]*=\S*)*)\s+(\d+)\s+(\d+)\s+([0-9.]+)\s+[0-9.]+\s+[0-9.]+\s+[0-9.]+\s+[0-9.]+\s+[0-9.]+\s+\d+%`)

func parse(r io.Reader, fileN int) ([]row, error) {
	var rows []row
	sc := bufio.NewScanner(r)
	for n := 0; sc.Scan(); n++ {
		m := rowRE.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		ctx, _ := strconv.Atoi(m[3])
		slots, _ := strconv.Atoi(m[4])
		p50, err := strconv.ParseFloat(m[5], 64)
		if err != nil {
			return nil, fmt.Errorf("line %d: p50 %q: %w", n+1, m[5], err)
		}
		rows = append(rows, row{name: m[1], env: strings.TrimSpace(m[2]), ctx: ctx, slots: slots, p50: p50, order: n, fileN: fileN})
	}
	return rows, sc.Err()
}

// pair is one A/B/A/B: the default's rows a[0], a[1] and the variant's b[0], b[1].
type pair struct {
	base, env  string
	ctx, slots int
	a, b       [2]float64
	first      [2]int // the file and line of its first row, for the order of the report
}

// verdict reads the project's rule from a pair (differences in us):
// "wins twice" where both of the variant's rows are faster than the
// default's beside them by more than the larger run-to-run spread of
// either's two rows (at least 1 us, the bench's rounding), "loses" where
// both are slower by as much, else "within spread".
func verdict(p pair) (d1, d2 float64, v string) {
	d1, d2 = 1000*(p.b[0]-p.a[0]), 1000*(p.b[1]-p.a[1])
	spread := 1000 * max(abs(p.a[1]-p.a[0]), abs(p.b[1]-p.b[0]))
	spread = max(spread, 1)
	switch {
	case d1 < -spread && d2 < -spread:
		v = "wins twice"
	case d1 > spread && d2 > spread:
		v = "loses"
	default:
		v = "within spread"
	}
	return d1, d2, v
}

func abs(x float64) float64 {
	if x < 0 {
		return -x
	}
	return x
}

// pairs groups rows named BASE-A, BASE-B, BASE-A2, BASE-B2 (a later row of
// the same name replaces an earlier one) into pairs; incomplete groups are
// returned by name.
func pairs(rows []row) ([]pair, []string) {
	type group struct {
		rows  map[string]row
		first [2]int
	}
	groups := map[string]*group{}
	for _, r := range rows {
		i := strings.LastIndexByte(r.name, '-')
		if i <= 0 {
			continue
		}
		base, tag := r.name[:i], r.name[i+1:]
		switch tag {
		case "A", "B", "A2", "B2":
		default:
			continue
		}
		g := groups[base]
		if g == nil {
			g = &group{rows: map[string]row{}, first: [2]int{r.fileN, r.order}}
			groups[base] = g
		}
		g.rows[tag] = r
	}
	var out []pair
	var partial []string
	for base, g := range groups {
		a1, okA1 := g.rows["A"]
		b1, okB1 := g.rows["B"]
		a2, okA2 := g.rows["A2"]
		b2, okB2 := g.rows["B2"]
		if !okA1 || !okB1 || !okA2 || !okB2 {
			partial = append(partial, base)
			continue
		}
		out = append(out, pair{base: base, env: b1.env, ctx: b1.ctx, slots: b1.slots,
			a: [2]float64{a1.p50, a2.p50}, b: [2]float64{b1.p50, b2.p50}, first: g.first})
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].first[0] != out[j].first[0] {
			return out[i].first[0] < out[j].first[0]
		}
		return out[i].first[1] < out[j].first[1]
	})
	sort.Strings(partial)
	return out, partial
}

func report(w io.Writer, ps []pair, partial []string) {
	fmt.Fprintf(w, "%-12s %7s %5s %15s %15s %17s  %-13s %s\n", "name", "context", "slots", "default ms", "variant ms", "variant-default us", "verdict", "variant")
	for _, p := range ps {
		d1, d2, v := verdict(p)
		fmt.Fprintf(w, "%-12s %7d %5d %7.3f %7.3f %7.3f %7.3f %+8.1f %+8.1f  %-13s %s\n",
			p.base, p.ctx, p.slots, p.a[0], p.a[1], p.b[0], p.b[1], d1, d2, v, p.env)
	}
	for _, b := range partial {
		fmt.Fprintf(w, "%-12s incomplete: not all of -A, -B, -A2, -B2 ran\n", b)
	}
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: go run ./internal/abab SUMMARY.txt... (the device plans' summary files, docs/measured/*/call*/summary.txt)")
		os.Exit(2)
	}
	var rows []row
	for i, path := range os.Args[1:] {
		f, err := os.Open(path)
		if err != nil {
			fmt.Fprintln(os.Stderr, "abab:", err)
			os.Exit(1)
		}
		rs, err := parse(f, i)
		f.Close()
		if err != nil {
			fmt.Fprintf(os.Stderr, "abab: %s: %v\n", path, err)
			os.Exit(1)
		}
		rows = append(rows, rs...)
	}
	ps, partial := pairs(rows)
	if len(ps) == 0 && len(partial) == 0 {
		fmt.Fprintln(os.Stderr, "abab: no A/B/A/B rows (NAME-A, NAME-B, NAME-A2, NAME-B2) in", strings.Join(os.Args[1:], " "))
		os.Exit(1)
	}
	report(os.Stdout, ps, partial)
}
