package cupti

import (
	"testing"
	"unsafe"

	"github.com/ebitengine/purego"
)

// TestCallbacksThroughC calls the two buffer callbacks through their C
// function pointers, as CUPTI does: a buffer is handed out (8-byte aligned,
// bufferBytes long), comes back with its valid bytes, and an address that
// was never handed out is counted as lost, not taken.
func TestCallbacksThroughC(t *testing.T) {
	req, done := callbacks()
	var buf, size uintptr
	maxRecs := uintptr(99)
	call(req, uintptr(unsafe.Pointer(&buf)), uintptr(unsafe.Pointer(&size)), uintptr(unsafe.Pointer(&maxRecs)))
	if buf == 0 || buf%8 != 0 || size != bufferBytes || maxRecs != 0 {
		t.Fatalf("request gave buffer %#x of %d bytes, max records %d", buf, size, maxRecs)
	}
	bufs.mu.Lock()
	b, out := bufs.out[buf]
	bufs.mu.Unlock()
	if !out {
		t.Fatal("the buffer handed out is not kept")
	}
	b[0], b[4095] = 7, 9 // CUPTI writes it
	const streamID = 0xfffffffe
	call(done, 0, streamID, buf, size, 4096)
	call(done, 0, streamID, buf+8, size, 16) // not ours
	bufs.mu.Lock()
	defer bufs.mu.Unlock()
	if len(bufs.done) != 1 || bufs.done[0].valid != 4096 || bufs.done[0].b[4095] != 9 || bufs.lost != 1 {
		t.Fatalf("after completion: %d buffers done, lost %d", len(bufs.done), bufs.lost)
	}
	if _, still := bufs.out[buf]; still {
		t.Error("a completed buffer is still counted as CUPTI's")
	}
	bufs.free = append(bufs.free, bufs.done[0].b)
	bufs.done, bufs.lost = nil, 0
}

// TestCallbackFromForeignThread: CUPTI hands buffers back from threads of
// its own; here a thread made by libc's pthread_create (not by Go) runs the
// completion callback, so the build without cgo (purego's fakecgo) is
// checked to take calls from such threads.
func TestCallbackFromForeignThread(t *testing.T) {
	libc, err := purego.Dlopen("libc.so.6", purego.RTLD_NOW|purego.RTLD_GLOBAL)
	if err != nil {
		t.Skipf("no libc.so.6: %v", err)
	}
	create, err := purego.Dlsym(libc, "pthread_create")
	if err != nil {
		t.Fatal(err)
	}
	join, err := purego.Dlsym(libc, "pthread_join")
	if err != nil {
		t.Fatal(err)
	}
	req, _ := callbacks()
	var buf, size, maxRecs uintptr
	call(req, uintptr(unsafe.Pointer(&buf)), uintptr(unsafe.Pointer(&size)), uintptr(unsafe.Pointer(&maxRecs)))
	start := purego.NewCallback(func(arg *byte) uintptr {
		bufferCompleted(0, 0, arg, bufferBytes, 128)
		return 0
	})
	var tid uintptr
	if r := call(create, uintptr(unsafe.Pointer(&tid)), 0, start, buf); r != 0 {
		t.Fatalf("pthread_create: %d", r)
	}
	if r := call(join, tid, 0); r != 0 {
		t.Fatalf("pthread_join: %d", r)
	}
	bufs.mu.Lock()
	defer bufs.mu.Unlock()
	if len(bufs.done) != 1 || bufs.done[0].valid != 128 || bufs.lost != 0 {
		t.Fatalf("after the foreign thread: %d buffers done, lost %d", len(bufs.done), bufs.lost)
	}
	bufs.free = append(bufs.free, bufs.done[0].b)
	bufs.done = nil
}
