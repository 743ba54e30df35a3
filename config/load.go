package config

import (
	"bytes"
	"fmt"
	"log/slog"
	"os"
	"regexp"
	"strings"

	"github.com/cockroachdb/errors"
	"github.com/pelletier/go-toml/v2"
)

// Sources maps a field's dotted path to where its effective value came from.
type Sources map[string]Source

// Options are the inputs to Load other than the defaults.
type Options struct {
	// File is the TOML file to read; empty reads none.
	File string
	// Env looks up environment variables; nil uses os.LookupEnv.
	Env func(string) (string, bool)
	// Flags holds values set on the command line, keyed by dotted path,
	// typed as the field is (string, int, float64, bool, []string).
	Flags map[string]any
}

// Load builds the effective configuration: defaults, then the file, then
// the environment, then flags. It validates the result.
func Load(opts Options) (*Config, Sources, error) {
	c := Default()
	src := Sources{}
	for _, f := range fields {
		src[f.Path()] = SourceDefault
	}
	if opts.File != "" {
		data, err := os.ReadFile(opts.File)
		if err != nil {
			return nil, nil, errors.WithHint(errors.Wrapf(err, "reading config file %s", opts.File),
				"pass an existing file with --config, or leave --config out to use the defaults")
		}
		set, err := decodeFile(opts.File, data, c)
		if err != nil {
			return nil, nil, err
		}
		for _, p := range set {
			src[p] = SourceFile
		}
	}
	lookup := opts.Env
	if lookup == nil {
		lookup = os.LookupEnv
	}
	for _, f := range fields {
		if s, ok := lookup(f.EnvName()); ok {
			if err := f.SetString(c, s); err != nil {
				return nil, nil, errors.WithHintf(errors.Wrapf(err, "environment variable %s", f.EnvName()),
					"set %s to a %s, or unset it", f.EnvName(), f.TypeName())
			}
			src[f.Path()] = SourceEnv
		}
	}
	if opts.Env == nil {
		warnUnknownEnv()
	}
	for path, v := range opts.Flags {
		f, ok := Lookup(path)
		if !ok {
			return nil, nil, errors.AssertionFailedf("flag bound to unknown config key %q", path)
		}
		f.Set(c, v)
		src[path] = SourceFlag
	}
	if err := c.Validate(); err != nil {
		return nil, nil, err
	}
	return c, src, nil
}

// decodeFile decodes data strictly into c (which holds the defaults) and
// returns the dotted paths the file set.
func decodeFile(name string, data []byte, c *Config) ([]string, error) {
	var raw map[string]any
	if err := toml.Unmarshal(data, &raw); err != nil {
		return nil, fileError(name, err)
	}
	// Top-level keys must all be tables; a bare key is almost always a key
	// written above its [section] header.
	var set []string
	for sec, v := range raw {
		tbl, ok := v.(map[string]any)
		if !ok {
			if _, isSec := sectionHelp(sec); isSec {
				return nil, errors.WithHintf(errors.Newf("%s: %q must be a table ([%s]), not a value", name, sec, sec),
					"write the keys of this section under a [%s] header", sec)
			}
			return nil, unknownKeyError(name, 0, []string{sec})
		}
		for k := range tbl {
			set = append(set, sec+"."+k)
		}
	}
	dec := toml.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(c); err != nil {
		return nil, fileError(name, err)
	}
	return set, nil
}

func fileError(name string, err error) error {
	var strict *toml.StrictMissingError
	if errors.As(err, &strict) && len(strict.Errors) > 0 {
		e := strict.Errors[0]
		row, _ := e.Position()
		return unknownKeyError(name, row, e.Key())
	}
	var de *toml.DecodeError
	if errors.As(err, &de) {
		row, col := de.Position()
		if f, ok := Lookup(strings.Join(de.Key(), ".")); ok {
			// A value of the wrong type: say so in TOML's words, not the
			// decoder's (which names Go struct fields).
			got := "this value"
			if m := tomlTypeRe.FindStringSubmatch(de.Error()); m != nil {
				got = "a TOML " + m[1]
			}
			return errors.WithHintf(errors.Newf("%s:%d:%d: %s must be a%s %s, got %s", name, row, col, f.Path(), article(f.TypeName()), f.TypeName(), got),
				"for example %s = %s (tilert.toml.example documents every key)", f.Key, exampleOf(f))
		}
		msg := strings.TrimPrefix(de.Error(), "toml: ")
		return errors.WithHint(errors.Newf("%s:%d:%d: %s", name, row, col, msg),
			"fix the TOML syntax at that position; tilert.toml.example documents every key")
	}
	return errors.WithHint(errors.Wrapf(err, "%s", name),
		"check each value's type against tilert.toml.example (strings quoted, numbers bare, lists in [ ])")
}

// tomlTypeRe finds the TOML type in go-toml's type-mismatch message.
var tomlTypeRe = regexp.MustCompile(`cannot decode TOML (\w+)`)

func article(typ string) string {
	if strings.IndexAny(typ[:1], "aeiou") == 0 {
		return "n"
	}
	return ""
}

// exampleOf is a value of f's type, as the TOML file would write it: the
// default when it has one.
func exampleOf(f Field) string {
	if v := formatValue(f.Get(Default())); v != "" && v != `""` && v != "[]" {
		return v
	}
	switch f.TypeName() {
	case "integer":
		return "1"
	case "number":
		return "1.5"
	case "boolean":
		return "true"
	case "list of strings":
		return `["a", "b"]`
	}
	return `"text"`
}

func unknownKeyError(name string, row int, key []string) error {
	loc := name
	if row > 0 {
		loc = fmt.Sprintf("%s:%d", name, row)
	}
	if len(key) == 1 {
		sec := key[0]
		err := errors.Newf("%s: unknown section [%s]", loc, sec)
		if near := Nearest(sec, keysIn("")); near != "" {
			return errors.WithHintf(err, "did you mean [%s]? Sections: %s", near, strings.Join(keysIn(""), ", "))
		}
		return errors.WithHintf(err, "valid sections: %s", strings.Join(keysIn(""), ", "))
	}
	sec, k := key[0], strings.Join(key[1:], ".")
	if _, ok := sectionHelp(sec); !ok {
		return unknownKeyError(name, row, key[:1])
	}
	err := errors.Newf("%s: unknown key %s.%s", loc, sec, k)
	valid := keysIn(sec)
	if near := Nearest(k, valid); near != "" {
		return errors.WithHintf(err, "did you mean %s.%s? Keys in [%s]: %s", sec, near, sec, strings.Join(valid, ", "))
	}
	return errors.WithHintf(err, "keys in [%s]: %s", sec, strings.Join(valid, ", "))
}

func sectionHelp(sec string) (string, bool) {
	for _, s := range sections() {
		if s.Section == sec {
			return s.Help, true
		}
	}
	return "", false
}

// warnUnknownEnv logs TILERT_ variables that set nothing, which usually
// means a misspelt name.
func warnUnknownEnv() {
	known := map[string]bool{"TILERT_CONFIG": true}
	var names []string
	for _, f := range fields {
		known[f.EnvName()] = true
		names = append(names, f.EnvName())
	}
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if !strings.HasPrefix(name, "TILERT_") || known[name] {
			continue
		}
		// Sections own the TILERT_<SECTION>_ prefix; other TILERT_ names
		// (test switches, library paths) are not config keys.
		sec, _, _ := strings.Cut(strings.TrimPrefix(name, "TILERT_"), "_")
		if _, ok := sectionHelp(strings.ToLower(sec)); !ok {
			continue
		}
		slog.Warn("environment variable sets no config key", "name", name, "did_you_mean", Nearest(name, names))
	}
}
