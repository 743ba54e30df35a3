package transfer

import (
	"github.com/tilert-go/tilert/config"
	"github.com/tilert-go/tilert/rdma"
)

// NewDeviceSender is NewSender for a sender that also sends straight from
// GPU memory (the connector sidecar's zero-copy path): the tcp engine reads
// device regions through dev's pinned buffers; nixl registers them as VRAM
// itself. A nil dev is NewSender.
func NewDeviceSender(t config.Transfer, secret []byte, dev rdma.DeviceReader) (rdma.Engine, error) {
	if dev == nil || t.Engine != "tcp" {
		return NewSender(t, secret)
	}
	return rdma.NewTCP(rdma.TCPConfig{Streams: t.Streams, Secret: secret, DeviceReader: dev})
}
