package cuda

import (
	"runtime"
	"strings"
	"testing"

	"github.com/cockroachdb/errors"
)

// TestRunJob checks the executor's answer to each way a Do function can
// end, without a GPU: every job is answered, and only a goroutine exit
// hands the queue to a new thread.
func TestRunJob(t *testing.T) {
	errF := errors.New("from f")
	for _, tc := range []struct {
		name      string
		f         func(*Ctx) error
		want      error
		substr    string
		rethreads bool
	}{
		{name: "returns nil", f: func(*Ctx) error { return nil }},
		{name: "returns an error", f: func(*Ctx) error { return errF }, want: errF},
		{name: "panics", f: func(*Ctx) error { panic("boom") }, substr: "panic on device thread: boom"},
		{name: "ends its goroutine", f: func(*Ctx) error { runtime.Goexit(); return nil }, want: ErrGoexit, rethreads: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			j := job{f: tc.f, res: make(chan error, 1)}
			took := make(chan bool, 1)
			exited := make(chan struct{})
			go func() {
				defer close(exited)
				runJob(nil, j, func() { took <- true })
			}()
			err := <-j.res
			<-exited
			switch {
			case tc.substr != "":
				if err == nil || !strings.Contains(err.Error(), tc.substr) {
					t.Fatalf("err %v, want one containing %q", err, tc.substr)
				}
			case !errors.Is(err, tc.want) && err != tc.want:
				t.Fatalf("err %v, want %v", err, tc.want)
			}
			rethreaded := false
			if tc.rethreads {
				rethreaded = <-took
			}
			select {
			case <-took:
				rethreaded = true
			default:
			}
			if rethreaded != tc.rethreads {
				t.Fatalf("queue handed to a new thread: %v, want %v", rethreaded, tc.rethreads)
			}
		})
	}
}

// TestDoAfterGoexit: on a GPU, a Do function that ends its goroutine (as a
// t.Skip inside Do does) returns ErrGoexit instead of hanging the caller,
// and the device keeps working on the thread that takes over.
func TestDoAfterGoexit(t *testing.T) {
	d := openTestDevice(t)
	if err := d.Do(func(*Ctx) error { runtime.Goexit(); return nil }); !errors.Is(err, ErrGoexit) {
		t.Fatalf("Do after Goexit: %v, want ErrGoexit", err)
	}
	want := []byte("still usable after the executor's goroutine ended")
	got := make([]byte, len(want))
	err := d.Do(func(c *Ctx) error {
		p, err := c.memAlloc(int64(len(want)))
		if err != nil {
			return err
		}
		defer c.memFree(p)
		if err := c.Upload(p, want); err != nil {
			return err
		}
		if err := c.Download(got, p); err != nil {
			return err
		}
		return c.SyncStream(c.Stream())
	})
	if err != nil {
		t.Fatalf("Do on the new thread: %+v", err)
	}
	if string(got) != string(want) {
		t.Fatalf("read back %q", got)
	}
}

// openTestDevice opens GPU 0 for a test, closed at its end; skips without one.
func openTestDevice(t *testing.T) *Device {
	t.Helper()
	d, err := Open(0)
	if errors.Is(err, ErrNoGPU) {
		t.Skip("no GPU")
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Close() })
	return d
}
