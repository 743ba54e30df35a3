package pd

import (
	"context"

	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/rdma"
)

// WriteOps sends caller-built writes into an accepted slot: for sources that
// are not one host slice per region (the connector sidecar sending vLLM's
// cache blocks straight from GPU memory, many spans per region). Each op's
// remote and range must fall inside one accepted destination; the caller
// computes the done checksum over the same bytes in accept order.
func (c *Client) WriteOps(ctx context.Context, acc *Accept, ops []rdma.WriteOp) error {
	for i := range ops {
		op := &ops[i]
		ok := false
		for _, d := range acc.Regions {
			if op.Remote.ID == d.Remote.ID && op.RemoteOff >= d.Offset && op.RemoteOff+op.Len <= d.Offset+d.Bytes {
				ok = true
				break
			}
		}
		if !ok {
			return errors.Newf("pd: op %d (%s) lands outside every accepted region of %s", i, op, acc.RID)
		}
	}
	if err := c.peer.Write(ctx, ops); err != nil {
		return errors.Wrapf(err, "pd: write %s into slot %d gen %d", acc.RID, acc.Slot, acc.Generation)
	}
	return nil
}
