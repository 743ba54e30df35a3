package gpu

import (
	"encoding/binary"
	"sync"
	"sync/atomic"

	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/cuda"
)

// RoutedLayer is one MoE layer's routing in a probed step: the Rows rows'
// top-k expert ids, row by row (Rows x k).
type RoutedLayer struct {
	Layer, Rows int
	IDs         []int32
}

// routeProbe collects the routing of the steps run while it is on
// (SetRoutingProbe): route copies each MoE layer's ids into a device
// buffer beside the step's work (a copy a layer: the step records other
// graphs than an unprobed one and is not for timing), and turning it off
// brings them to the host. bench decode uses it to count the routed experts
// a step actually touched (its floor otherwise assumes uniform routing).
type routeProbe struct {
	// active mirrors on for route's check in every step (no lock there).
	active  atomic.Bool
	mu      sync.Mutex
	on      bool
	dev     cuda.DevPtr
	capInts int
	used    int
	pending []probeEntry
	layers  []RoutedLayer
}

type probeEntry struct{ layer, rows, off, n int }

// SetRoutingProbe turns the routing probe on (for the steps that follow:
// at most two, of any rows) or off (the collected routing is then what
// RoutedLayers returns).
func (e *Engine) SetRoutingProbe(on bool) error {
	p := &e.m.probe
	p.mu.Lock()
	defer p.mu.Unlock()
	if on == p.on {
		return nil
	}
	c := e.m.cfg
	if on {
		// Two steps of every slot with a draft row each through every layer.
		p.capInts = 2 * 2 * max(1, e.m.opts.Slots) * max(1, c.NumExpertsPerTok) * (c.NumAllLayers() + 1)
		err := e.m.r.run(func(b device) error {
			d, err := b.alloc(int64(4 * p.capInts))
			p.dev = d
			return err
		})
		if err != nil {
			return errors.Wrap(err, "routing probe: allocating its buffer")
		}
		p.on, p.used, p.pending, p.layers = true, 0, nil, nil
		p.active.Store(true)
		return nil
	}
	p.on = false
	p.active.Store(false)
	raw := make([]byte, 4*p.used)
	err := e.m.r.run(func(b device) error {
		var err error
		if p.used > 0 {
			err = b.download(raw, p.dev)
		}
		return errors.CombineErrors(err, b.free(p.dev))
	})
	p.dev = 0
	if err != nil {
		return errors.Wrap(err, "routing probe: reading its buffer")
	}
	for _, pe := range p.pending {
		ids := make([]int32, pe.n)
		for i := range ids {
			ids[i] = int32(binary.LittleEndian.Uint32(raw[4*(pe.off+i):]))
		}
		p.layers = append(p.layers, RoutedLayer{Layer: pe.layer, Rows: pe.rows, IDs: ids})
	}
	p.pending = nil
	return nil
}

// RoutedLayers returns the routing the last probe collected, in the order
// the layers ran (an MTP step's main forward, then its MTP layer), and
// clears it.
func (e *Engine) RoutedLayers() []RoutedLayer {
	p := &e.m.probe
	p.mu.Lock()
	defer p.mu.Unlock()
	r := p.layers
	p.layers = nil
	return r
}

// slot says where route copies layer's routing of rows rows x k ids in the
// probe's buffer (false: not probing, or the buffer is full).
func (p *routeProbe) slot(layer, rows, k int) (cuda.DevPtr, bool) {
	if !p.active.Load() {
		return 0, false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	n := rows * k
	if !p.on || p.used+n > p.capInts {
		return 0, false
	}
	p.pending = append(p.pending, probeEntry{layer: layer, rows: rows, off: p.used, n: n})
	d := fptr(p.dev, p.used)
	p.used += n
	return d, true
}
