// Package cudatest opens the GPU for tests: once per test binary, skipping
// (with the reason and how to run the check elsewhere) where there is none.
// Test code only.
package cudatest

import (
	"sync"
	"testing"

	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/cuda"
)

var (
	once sync.Once
	dev  *cuda.Device
	err  error
)

// Device is GPU 0, opened on first use. Without a usable GPU the test is
// skipped; any other failure to open it fails the test.
func Device(t testing.TB) *cuda.Device {
	t.Helper()
	once.Do(func() { dev, err = cuda.Open(0) })
	if err != nil {
		if errors.Is(err, cuda.ErrNoGPU) {
			t.Skipf("no GPU here, GPU test skipped (run scripts/gpu-check.sh on a GPU machine): %v", err)
		}
		t.Fatalf("opening GPU 0: %+v", err)
	}
	return dev
}

// Close closes the GPU if a test opened it (call it from TestMain).
func Close() error {
	if dev == nil {
		return nil
	}
	return dev.Close()
}
