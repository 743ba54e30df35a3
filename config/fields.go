package config

import (
	"fmt"
	"reflect"
	"sort"
	"strconv"
	"strings"

	"github.com/cockroachdb/errors"
)

// Source says where an effective value came from.
type Source string

// Sources, from highest to lowest precedence.
const (
	SourceFlag    Source = "flag"
	SourceEnv     Source = "env"
	SourceFile    Source = "file"
	SourceDefault Source = "default"
)

// Field describes one configuration key.
type Field struct {
	Section string // TOML table, e.g. "decode"
	Key     string // key inside the table, e.g. "ctrl_port"
	Help    string
	index   []int
	kind    reflect.Kind
}

// Path is the dotted name, e.g. "decode.ctrl_port".
func (f Field) Path() string { return f.Section + "." + f.Key }

// EnvName is the environment variable that sets the key.
func (f Field) EnvName() string {
	return "TILERT_" + strings.ToUpper(f.Section) + "_" + strings.ToUpper(f.Key)
}

// TypeName is a short human name for the value type.
func (f Field) TypeName() string {
	switch f.kind {
	case reflect.Int:
		return "integer"
	case reflect.Float64:
		return "number"
	case reflect.Bool:
		return "boolean"
	case reflect.Slice:
		return "list of strings"
	default:
		return "string"
	}
}

func (f Field) value(c *Config) reflect.Value {
	return reflect.ValueOf(c).Elem().FieldByIndex(f.index)
}

// Get returns the field's value in c.
func (f Field) Get(c *Config) any { return f.value(c).Interface() }

// SetString parses s as the field's type and stores it in c. Lists are
// comma separated.
func (f Field) SetString(c *Config, s string) error {
	v := f.value(c)
	switch f.kind {
	case reflect.String:
		v.SetString(s)
	case reflect.Int:
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil {
			return errors.Newf("%s wants an integer, got %q", f.Path(), s)
		}
		v.SetInt(int64(n))
	case reflect.Float64:
		x, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
		if err != nil {
			return errors.Newf("%s wants a number, got %q", f.Path(), s)
		}
		v.SetFloat(x)
	case reflect.Bool:
		b, err := strconv.ParseBool(strings.TrimSpace(s))
		if err != nil {
			return errors.Newf("%s wants true or false, got %q", f.Path(), s)
		}
		v.SetBool(b)
	case reflect.Slice:
		var items []string
		for _, p := range strings.Split(s, ",") {
			if p = strings.TrimSpace(p); p != "" {
				items = append(items, p)
			}
		}
		v.Set(reflect.ValueOf(items))
	default:
		return errors.AssertionFailedf("config field %s has unsupported kind %s", f.Path(), f.kind)
	}
	return nil
}

// Set stores a Go value of the field's type in c.
func (f Field) Set(c *Config, x any) { f.value(c).Set(reflect.ValueOf(x)) }

var fields = buildFields()

func buildFields() []Field {
	var out []Field
	t := reflect.TypeOf(Config{})
	for i := 0; i < t.NumField(); i++ {
		sec := t.Field(i)
		st := sec.Type
		for j := 0; j < st.NumField(); j++ {
			kf := st.Field(j)
			out = append(out, Field{
				Section: sec.Tag.Get("toml"),
				Key:     kf.Tag.Get("toml"),
				Help:    kf.Tag.Get("help"),
				index:   []int{i, j},
				kind:    kf.Type.Kind(),
			})
		}
	}
	return out
}

// Fields lists every key in declaration order.
func Fields() []Field { return append([]Field(nil), fields...) }

// Lookup finds a field by its dotted path.
func Lookup(path string) (Field, bool) {
	for _, f := range fields {
		if f.Path() == path {
			return f, true
		}
	}
	return Field{}, false
}

// sections returns table names with their help, in declaration order.
func sections() []Field {
	var out []Field
	t := reflect.TypeOf(Config{})
	for i := 0; i < t.NumField(); i++ {
		out = append(out, Field{Section: t.Field(i).Tag.Get("toml"), Help: t.Field(i).Tag.Get("help")})
	}
	return out
}

// Nearest is the candidate closest to s by edit distance, or "" when none
// is close enough to be a likely typo (config keys, subcommands).
func Nearest(s string, candidates []string) string {
	best, bestD := "", len(s)/2+2
	for _, c := range candidates {
		if d := editDistance(s, c); d < bestD {
			best, bestD = c, d
		}
	}
	return best
}

// editDistance is the optimal-string-alignment distance: insertions,
// deletions, substitutions and adjacent transpositions ("prot" for "port")
// each cost one.
func editDistance(a, b string) int {
	d := make([][]int, len(a)+1)
	for i := range d {
		d[i] = make([]int, len(b)+1)
		d[i][0] = i
	}
	for j := range d[0] {
		d[0][j] = j
	}
	for i := 1; i <= len(a); i++ {
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			d[i][j] = min(d[i-1][j]+1, d[i][j-1]+1, d[i-1][j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				d[i][j] = min(d[i][j], d[i-2][j-2]+1)
			}
		}
	}
	return d[len(a)][len(b)]
}

// keysIn lists the keys of a section (or the section names for "").
func keysIn(section string) []string {
	var out []string
	if section == "" {
		for _, s := range sections() {
			out = append(out, s.Section)
		}
		return out
	}
	for _, f := range fields {
		if f.Section == section {
			out = append(out, f.Key)
		}
	}
	sort.Strings(out)
	return out
}

func formatValue(x any) string {
	switch v := x.(type) {
	case string:
		return strconv.Quote(v)
	case []string:
		q := make([]string, len(v))
		for i, s := range v {
			q[i] = strconv.Quote(s)
		}
		return "[" + strings.Join(q, ", ") + "]"
	case float64:
		s := strconv.FormatFloat(v, 'f', -1, 64)
		if !strings.ContainsAny(s, ".eE") {
			s += ".0"
		}
		return s
	default:
		return fmt.Sprint(v)
	}
}
