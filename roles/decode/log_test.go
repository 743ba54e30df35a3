package decode

import (
	"io"
	"log/slog"
	"os"
	"testing"
)

// testLogger keeps node logs out of test output unless -v.
func testLogger(t testing.TB) *slog.Logger {
	if testing.Verbose() && os.Getenv("TILERT_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}
