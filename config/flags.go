package config

import (
	"fmt"
	"reflect"

	"github.com/cockroachdb/errors"
	"github.com/urfave/cli/v2"
)

// Flag binds a command-line flag to a config key.
type Flag struct {
	Key     string   // dotted config path, e.g. "decode.ctrl_port"
	Name    string   // flag name, Go style, e.g. "ctrl-port"
	Aliases []string // other spellings, e.g. the launch post's "model_dir"
	Usage   string   // optional; defaults to the key's help text
}

// CLI returns the urfave/cli flag for f, with the default value and the
// environment variable in its help. The environment is read by Load, not by
// cli, so precedence stays flag > env > file.
func (f Flag) CLI() cli.Flag {
	field, ok := Lookup(f.Key)
	if !ok {
		panic(fmt.Sprintf("config: flag %q bound to unknown key %q", f.Name, f.Key))
	}
	usage := f.Usage
	if usage == "" {
		usage = field.Help
	}
	usage = fmt.Sprintf("%s [config %s, env %s]", usage, field.Path(), field.EnvName())
	def := field.Get(Default())
	switch field.kind {
	case reflect.Int:
		return &cli.IntFlag{Name: f.Name, Aliases: f.Aliases, Usage: usage, Value: def.(int)}
	case reflect.Float64:
		return &cli.Float64Flag{Name: f.Name, Aliases: f.Aliases, Usage: usage, Value: def.(float64)}
	case reflect.Bool:
		return &cli.BoolFlag{Name: f.Name, Aliases: f.Aliases, Usage: usage, Value: def.(bool)}
	case reflect.Slice:
		var v *cli.StringSlice
		if s := def.([]string); len(s) > 0 {
			v = cli.NewStringSlice(s...)
		}
		return &cli.StringSliceFlag{Name: f.Name, Aliases: f.Aliases, Usage: usage, Value: v}
	default:
		return &cli.StringFlag{Name: f.Name, Aliases: f.Aliases, Usage: usage, Value: def.(string)}
	}
}

// CLIFlags converts a list of bindings.
func CLIFlags(fs []Flag) []cli.Flag {
	out := make([]cli.Flag, len(fs))
	for i, f := range fs {
		out[i] = f.CLI()
	}
	return out
}

// Common flags every role takes.
var Common = []Flag{
	{Key: "log.level", Name: "log-level"},
	{Key: "log.format", Name: "log-format"},
}

// ConfigFlag selects the TOML file; it is not a key itself.
var ConfigFlag = &cli.StringFlag{
	Name: "config", Aliases: []string{"c"}, EnvVars: []string{"TILERT_CONFIG"},
	Usage: "TOML config file (see tilert.toml.example)",
}

// FromCLI loads the configuration for a command: the --config file, the
// environment, and the flags in fs that were set on the command line.
func FromCLI(c *cli.Context, fs []Flag) (*Config, Sources, error) {
	set := map[string]any{}
	for _, f := range fs {
		if !c.IsSet(f.Name) {
			continue
		}
		field, _ := Lookup(f.Key)
		switch field.kind {
		case reflect.Int:
			set[f.Key] = c.Int(f.Name)
		case reflect.Float64:
			set[f.Key] = c.Float64(f.Name)
		case reflect.Bool:
			set[f.Key] = c.Bool(f.Name)
		case reflect.Slice:
			set[f.Key] = c.StringSlice(f.Name)
		default:
			set[f.Key] = c.String(f.Name)
		}
	}
	cfg, src, err := Load(Options{File: c.String("config"), Flags: set})
	if err != nil {
		return nil, nil, errors.Wrap(err, "loading configuration")
	}
	return cfg, src, nil
}
