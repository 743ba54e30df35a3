// Package buildinfo carries the version stamped in by the Makefile's ldflags.
package buildinfo

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

// Set with -ldflags "-X github.com/tilert-go/tilert/internal/buildinfo.Version=...".
var (
	Version = "dev"
	Commit  = ""
)

// CommitOrVCS returns the stamped commit, or the one Go recorded from the
// checkout when built without the Makefile.
func CommitOrVCS() string {
	if Commit != "" {
		return Commit
	}
	if bi, ok := debug.ReadBuildInfo(); ok {
		rev, dirty := "", false
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.modified":
				dirty = s.Value == "true"
			}
		}
		if rev != "" {
			if dirty {
				rev += "-dirty"
			}
			return rev
		}
	}
	return "unknown"
}

// String is the one-line version report.
func String() string {
	return fmt.Sprintf("tilert %s (commit %s, %s %s/%s)", Version, CommitOrVCS(), runtime.Version(), runtime.GOOS, runtime.GOARCH)
}
