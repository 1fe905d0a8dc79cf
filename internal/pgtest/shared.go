package pgtest

import (
	"fmt"
	"os"
	"sync"
	"testing"
)

// shared is one server for a whole test package, started on first use and
// stopped by StopShared.
var shared struct {
	once sync.Once
	srv  *Server
	dir  string
	err  error
}

// Shared returns the package-wide server, starting it on first use. Without
// the binaries it skips tb, or fails it when DLOCK_REQUIRE_POSTGRES=1. Tests
// sharing it must use their own tables (or databases). Call StopShared from
// TestMain after m.Run.
func Shared(tb testing.TB) *Server {
	tb.Helper()
	skipOrFail(tb)
	shared.once.Do(func() {
		if shared.dir, shared.err = os.MkdirTemp("", "pgtest-"); shared.err != nil {
			return
		}
		shared.srv, shared.err = StartProcess(shared.dir)
	})
	if shared.err != nil {
		tb.Fatalf("shared postgres: %v", shared.err)
	}
	return shared.srv
}

// StopShared stops the package-wide server, if one was started, and removes
// its directory.
func StopShared() {
	if shared.srv != nil {
		shared.srv.Stop()
	}
	if shared.dir != "" {
		if err := os.RemoveAll(shared.dir); err != nil {
			fmt.Fprintln(os.Stderr, "pgtest:", err)
		}
	}
}
