// Package cliutil holds what every subcommand shares: logging setup,
// exit codes and how errors with hints are shown.
package cliutil

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/cockroachdb/errors"
	"github.com/urfave/cli/v2"

	"github.com/tilert-go/tilert/config"
)

// Exit codes.
const (
	ExitOK      = 0
	ExitFailure = 1
	ExitUsage   = 2 // usage errors (bad flags or values) and roles not built yet
)

type exitCoder interface{ ExitCode() int }

type codedError struct {
	error
	code int
}

func (e *codedError) ExitCode() int { return e.code }
func (e *codedError) Unwrap() error { return e.error }

// WithExitCode marks err so main exits with code.
func WithExitCode(err error, code int) error {
	if err == nil {
		return nil
	}
	return &codedError{error: err, code: code}
}

// NotBuilt is the error of a role whose implementation has not landed.
func NotBuilt(role, missing string) error {
	return WithExitCode(errors.WithHintf(errors.Newf("tilert %s is not available in this build: %s", role, missing),
		"track the project's issues for when it lands; `tilert --help` lists what works today"), ExitUsage)
}

// SetupLogging installs the slog default handler from the [log] section.
func SetupLogging(w io.Writer, l config.Log) {
	var level slog.Level
	_ = level.UnmarshalText([]byte(l.Level)) // validated by config
	opts := &slog.HandlerOptions{Level: level}
	var h slog.Handler
	if l.Format == "json" {
		h = slog.NewJSONHandler(w, opts)
	} else {
		h = slog.NewTextHandler(w, opts)
	}
	slog.SetDefault(slog.New(h))
}

// Load loads the config for a command and sets up logging from it.
func Load(c *cli.Context, fs []config.Flag) (*config.Config, config.Sources, error) {
	cfg, src, err := config.FromCLI(c, append(append([]config.Flag(nil), config.Common...), fs...))
	if err != nil {
		return nil, nil, err
	}
	SetupLogging(os.Stderr, cfg.Log)
	return cfg, src, nil
}

// Flags returns the cli flags a role takes: --config, the common ones and
// its own.
func Flags(fs []config.Flag) []cli.Flag {
	out := []cli.Flag{config.ConfigFlag}
	out = append(out, config.CLIFlags(config.Common)...)
	return append(out, config.CLIFlags(fs)...)
}

// Report prints err with its hints and returns the process exit code.
func Report(w io.Writer, err error) int {
	if err == nil {
		return ExitOK
	}
	code := ExitFailure
	var ec exitCoder
	if errors.As(err, &ec) {
		code = ec.ExitCode()
	}
	fmt.Fprintf(w, "tilert: error: %v\n", err)
	for _, h := range errors.GetAllHints(err) {
		for _, line := range strings.Split(h, "\n") {
			fmt.Fprintf(w, "  hint: %s\n", line)
		}
	}
	return code
}

// SuggestCommands makes an unknown subcommand (of the app or of a command
// group such as `bench`) fail with exit code 2 and the nearest name, not a
// help page: `tilert decod` says "did you mean decode?".
func SuggestCommands(app *cli.App) {
	app.Action = unknownCommand(false, func(c *cli.Context) []*cli.Command { return c.App.Commands })
	var walk func([]*cli.Command)
	walk = func(cmds []*cli.Command) {
		for _, cmd := range cmds {
			if len(cmd.Subcommands) > 0 && cmd.Action == nil {
				sub := cmd.Subcommands
				cmd.Action = unknownCommand(true, func(*cli.Context) []*cli.Command { return sub })
			}
			walk(cmd.Subcommands)
		}
	}
	walk(app.Commands)
}

func unknownCommand(group bool, cmds func(*cli.Context) []*cli.Command) cli.ActionFunc {
	return func(c *cli.Context) error {
		if !c.Args().Present() {
			if group {
				return cli.ShowSubcommandHelp(c)
			}
			return cli.ShowAppHelp(c)
		}
		name := c.Args().First()
		var names []string
		for _, cmd := range cmds(c) {
			if !cmd.Hidden && cmd.Name != "help" {
				names = append(names, cmd.Name)
			}
		}
		err := errors.Newf("unknown command %q", name)
		if near := config.Nearest(name, names); near != "" {
			return WithExitCode(errors.WithHintf(err, "did you mean %s? (commands: %s)", near, strings.Join(names, ", ")), ExitUsage)
		}
		return WithExitCode(errors.WithHintf(err, "commands: %s; --help shows what each does", strings.Join(names, ", ")), ExitUsage)
	}
}

// RunRole is a serving role's action: load the config from c for the
// role's flags, then run until SIGINT or SIGTERM ends ctx (run shuts down
// gracefully when it does).
func RunRole(c *cli.Context, flags []config.Flag, run func(ctx context.Context, cfg *config.Config) error) error {
	cfg, _, err := Load(c, flags)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(c.Context, syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	return run(ctx, cfg)
}
