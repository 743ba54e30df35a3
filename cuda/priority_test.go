package cuda

import (
	"bytes"
	"testing"
)

// TestStreamPriority: the device's priority range, a stream at its greatest
// priority, one outside it refused, and a graph captured on the raised
// stream instantiated with the nodes' own priorities, replayed and checked
// (a driver refusing the instantiate flag fails here).
func TestStreamPriority(t *testing.T) {
	d := openTestDevice(t)
	err := d.Do(func(c *Ctx) error {
		least, greatest, err := c.StreamPriorityRange()
		if err != nil {
			return err
		}
		t.Logf("stream priorities: least %d, greatest %d", least, greatest)
		if greatest > least {
			t.Errorf("greatest priority %d is numerically above the least %d", greatest, least)
		}
		if _, err := c.NewStreamWithPriority(greatest - 1); err == nil {
			t.Errorf("priority %d (past the greatest %d) was accepted", greatest-1, greatest)
		}
		s, err := c.NewStreamWithPriority(greatest)
		if err != nil {
			return err
		}
		defer func() { _ = c.DestroyStream(s) }()
		p, err := c.memAlloc(4096)
		if err != nil {
			return err
		}
		defer c.memFree(p)
		if err := c.BeginCapture(s); err != nil {
			return err
		}
		if err := c.MemsetD8(p, 0x5a, 4096, s); err != nil {
			return err
		}
		g, err := c.EndCaptureWith(s, true)
		if err != nil {
			return err
		}
		defer func() { _ = c.DestroyGraph(g) }()
		if err := c.Upload(p, make([]byte, 4096)); err != nil {
			return err
		}
		if err := c.LaunchGraph(g, s); err != nil {
			return err
		}
		if err := c.SyncStream(s); err != nil {
			return err
		}
		got := make([]byte, 4096)
		if err := c.Download(got, p); err != nil {
			return err
		}
		if !bytes.Equal(got, bytes.Repeat([]byte{0x5a}, 4096)) {
			t.Errorf("the replayed graph did not set the buffer")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
