// Package transfer starts the configured transfer engine: the receiving
// side of a decode node (tcp listens and announces a dialable address) or
// the sending side of a connector sidecar or dev tool (no listener).
package transfer

import (
	"net"

	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/config"
	"github.com/tilert-go/tilert/internal/cliutil"
	"github.com/tilert-go/tilert/pd"
	"github.com/tilert-go/tilert/rdma"
	"github.com/tilert-go/tilert/rdma/nixl"
)

// NewReceiver starts t's engine for a decode node bound to host: tcp listens
// on t.Listen and, when that is a wildcard, announces host (or this
// machine's first non-loopback IPv4 address) so peers can dial it; its
// streams prove sec.Secret and are capped and timed as the ctrl port's
// connections.
func NewReceiver(t config.Transfer, host string, sec pd.Security) (rdma.Engine, error) {
	sec.Defaults()
	switch t.Engine {
	case "tcp":
		cfg := rdma.TCPConfig{Listen: t.Listen, Streams: t.Streams, Secret: sec.Secret, MaxConns: sec.MaxConns,
			MaxConnsPerPeer: sec.MaxConnsPerPeer, HandshakeTimeout: sec.ReadTimeout, IdleTimeout: sec.IdleTimeout}
		e, err := rdma.NewTCP(cfg)
		if err != nil {
			return nil, err
		}
		if adv := advertise(e.Endpoint(), host); adv != "" {
			_ = e.Close()
			cfg.Advertise = adv
			// Listen again on the port the kernel picked, now advertised.
			cfg.Listen = listenAddr(t.Listen, adv)
			return rdma.NewTCP(cfg)
		}
		return e, nil
	case "nixl":
		return newNIXL(t)
	}
	return nil, unknown(t.Engine, "")
}

// NewSender starts t's engine for sending only (tcp opens no listener; its
// streams prove secret, nil for nodes without one).
func NewSender(t config.Transfer, secret []byte) (rdma.Engine, error) {
	switch t.Engine {
	case "tcp":
		return rdma.NewTCP(rdma.TCPConfig{Streams: t.Streams, Secret: secret})
	case "nixl":
		return newNIXL(t)
	}
	return nil, unknown(t.Engine, ", as the decode nodes")
}

func newNIXL(t config.Transfer) (rdma.Engine, error) {
	e, err := nixl.New(nixl.Config{Lib: t.NixlLib})
	if err != nil {
		return nil, errors.Wrap(err, "transfer engine nixl")
	}
	return e, nil
}

func unknown(name, also string) error {
	return cliutil.WithExitCode(errors.WithHint(errors.Newf("unknown transfer engine %q", name),
		"use --transfer-engine tcp or nixl"+also), cliutil.ExitUsage)
}

// advertise returns host:port to announce when the tcp engine listens on a
// wildcard address (peers cannot dial 0.0.0.0): the decode host when it is
// specific, else the first non-loopback IPv4 address, else loopback.
// Empty when the listen address is specific already.
func advertise(endpoint, host string) string {
	hp := endpoint[len("tcp://"):]
	h, port, err := net.SplitHostPort(hp)
	if err != nil {
		return ""
	}
	if ip := net.ParseIP(h); ip == nil || !ip.IsUnspecified() {
		return ""
	}
	if ip := net.ParseIP(host); host != "" && (ip == nil || !ip.IsUnspecified()) {
		return net.JoinHostPort(host, port)
	}
	if as, err := net.InterfaceAddrs(); err == nil {
		for _, a := range as {
			if ipn, ok := a.(*net.IPNet); ok && !ipn.IP.IsLoopback() && ipn.IP.To4() != nil {
				return net.JoinHostPort(ipn.IP.String(), port)
			}
		}
	}
	return net.JoinHostPort("127.0.0.1", port)
}

func listenAddr(listen, adv string) string {
	h, _, _ := net.SplitHostPort(listen)
	_, port, _ := net.SplitHostPort(adv)
	return net.JoinHostPort(h, port)
}
