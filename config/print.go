package config

import (
	"fmt"
	"io"
	"strings"

	"github.com/tilert-go/tilert/model"
)

// CanonicalModel maps the accepted spellings of a model name to the
// family name the rest of the config uses.
func CanonicalModel(name string) (model.Family, error) { return model.ParseModelName(name) }

// redacted keys hold secrets themselves; Print never shows them.
var redacted = map[string]bool{"router.api_key": true}

// Print writes c as TOML, each value followed by the source it came from.
func Print(w io.Writer, c *Config, src Sources) error {
	var b strings.Builder
	section := ""
	for _, f := range fields {
		if f.Section != section {
			if section != "" {
				b.WriteString("\n")
			}
			section = f.Section
			fmt.Fprintf(&b, "[%s]\n", section)
		}
		v := formatValue(f.Get(c))
		if redacted[f.Path()] && f.Get(c) != "" {
			v = `"(redacted)"`
		}
		fmt.Fprintf(&b, "%s = %s  # %s\n", f.Key, v, src[f.Path()])
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// Example renders the documented example file: every key with its help,
// its environment variable and its default value.
func Example() string {
	var b strings.Builder
	b.WriteString("# tilert.toml: one file for every tilert role.\n")
	b.WriteString("# Precedence: command-line flag > environment variable > this file > default.\n")
	b.WriteString("# Every key below is shown with its default value; delete what you do not change.\n")
	b.WriteString("# Generated from config/config.go by `go test ./config -run TestExample -update`.\n")
	d := Default()
	section := ""
	for _, f := range fields {
		if f.Section != section {
			section = f.Section
			help, _ := sectionHelp(section)
			fmt.Fprintf(&b, "\n# %s\n[%s]\n", help, section)
		}
		fmt.Fprintf(&b, "# %s (env %s)\n%s = %s\n", f.Help, f.EnvName(), f.Key, formatValue(f.Get(d)))
	}
	return b.String()
}
