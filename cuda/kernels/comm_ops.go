package kernels

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"regexp"

	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/cuda"
)

// AllReduceOneShot sums n float32 across nranks buffers in one launch:
// table holds the nranks device pointers (each addressable from this
// device); every buffer ends with the sum, added in rank order.
func (k *Set) AllReduceOneShot(s cuda.Stream, table cuda.DevPtr, nranks, n int) error {
	if nranks < 1 || n <= 0 {
		return errors.Newf("allreduce_oneshot: nranks=%d n=%d", nranks, n)
	}
	return k.launch("allreduce_oneshot_f32", cuda.D1(min(cdiv(n, 256), 1024)), cuda.D1(256), 0, s, table, int32(nranks), int64(n))
}

// CommMaxSlots is the number of barrier slots of a PeerBarrier's flag
// array: one per block of the largest grid a barrier launch uses.
const CommMaxSlots = 1024

// PeerBarrier makes a launch wait, on the device, until every rank's launch
// of the same call has started (ranks on different GPUs, flags in
// peer-mapped memory). Flags is this rank's array of CommMaxSlots x Ranks
// uint32 (zeroed before the first use, in its own memory); Table holds the
// Ranks device pointers of every rank's array as this device maps them.
// The zero value (Flags 0) is no barrier: ranks on one device are ordered
// by their stream.
type PeerBarrier struct {
	Flags, Table cuda.DevPtr
	Rank, Ranks  int
}

// PeerFlagBytes is the size of one rank's flag array for ranks ranks.
func PeerFlagBytes(ranks int) int64 { return 4 * int64(CommMaxSlots) * int64(ranks) }

func (b PeerBarrier) check(nranks int) error {
	if b.Flags == 0 {
		return nil
	}
	if b.Table == 0 || b.Ranks != nranks || b.Rank < 0 || b.Rank >= nranks {
		return errors.Newf("peer barrier: rank %d of %d, %d buffers", b.Rank, b.Ranks, nranks)
	}
	return nil
}

// arCols and ArMaxRows are comm.cu's AR_COLS and AR_MAX_ROWS.
const (
	arCols = 1024
	// ArMaxRows is the most rows one AllReduceAddRMSNorm takes.
	ArMaxRows = 1024
)

// ArScratchBytes is the scratch AllReduceAddRMSNorm needs for up to rows
// rows of D: a counter per row (zeroed before the first launch; every
// launch leaves them zero) and each row's per-block sums.
func ArScratchBytes(rows, D int) int64 {
	return 4 * int64(ArMaxRows+rows*cdiv(D, arCols))
}

// AllReduceAddRMSNorm is the all-reduce fused with the residual add and
// RMSNorm after it: s = the rank-order sum of the nranks partial buffers
// listed in parts (rows x D float32 each), then for each of the nout (x, h,
// w) pointer triples listed in outs: x += s, h = x*rsqrt(mean(x^2)+eps)*w.
// A row is spread over ceil(D/1024) blocks; the last to finish normalises
// it (scratch: ArScratchBytes). Ranks on one device: one launch, every
// rank's triple, no barrier. Ranks on several GPUs: each rank its own
// triple and scratch, parts peer-mapped, with bar.
func (k *Set) AllReduceAddRMSNorm(s cuda.Stream, parts cuda.DevPtr, nranks int, outs cuda.DevPtr, nout, rows, D int, eps float32, scratch cuda.DevPtr, bar PeerBarrier) error {
	G := cdiv(D, arCols)
	if nranks < 1 || nout < 1 || rows <= 0 || D <= 0 || rows > ArMaxRows || rows*G > CommMaxSlots || scratch == 0 {
		return errors.Newf("allreduce_add_rmsnorm: nranks=%d nout=%d rows=%d D=%d scratch=%#x", nranks, nout, rows, D, uint64(scratch))
	}
	if err := bar.check(nranks); err != nil {
		return err
	}
	return k.launch("allreduce_add_rmsnorm", cuda.D3(G, rows, 1), cuda.D1(arCols), 0, s,
		parts, int32(nranks), outs, int32(nout), int32(D), eps, scratch, bar.Flags, bar.Table, int32(bar.Rank))
}

// AllReduceTo writes the rank-order sum of the nranks buffers listed in
// parts (n float32 each, unchanged) into out, after bar when set.
func (k *Set) AllReduceTo(s cuda.Stream, parts cuda.DevPtr, nranks int, out cuda.DevPtr, n int, bar PeerBarrier) error {
	if nranks < 1 || n <= 0 {
		return errors.Newf("allreduce_to: nranks=%d n=%d", nranks, n)
	}
	if err := bar.check(nranks); err != nil {
		return err
	}
	return k.launch("allreduce_to_f32", cuda.D1(AllReduceToGrid(n)), cuda.D1(256), 0, s,
		parts, int32(nranks), out, int64(n), bar.Flags, bar.Table, int32(bar.Rank))
}

// BroadcastFrom copies nbytes (a multiple of 4) from src, another rank's
// peer-mapped buffer, into dst after bar.
func (k *Set) BroadcastFrom(s cuda.Stream, src, dst cuda.DevPtr, nbytes int64, bar PeerBarrier) error {
	if nbytes <= 0 || nbytes%4 != 0 {
		return errors.Newf("broadcast_from: %d bytes (a positive multiple of 4)", nbytes)
	}
	n := nbytes / 4
	return k.launch("broadcast_from_u32", cuda.D1(int(min((n+255)/256, CommMaxSlots))), cuda.D1(256), 0, s,
		src, dst, n, int32(max(bar.Ranks, 1)), bar.Flags, bar.Table, int32(bar.Rank))
}

// KernelNames lists the entry points of a compiled module image: the
// global functions of a cubin's symbol table, or the .entry directives of
// PTX.
func KernelNames(c *cuda.Compiled) ([]string, error) {
	if c.Cubin || bytes.HasPrefix(c.Image, []byte("\x7fELF")) {
		// CUDA's ELF marks its ABI version in EI_VERSION and e_version,
		// which debug/elf refuses: read a copy marked as plain ELF.
		img := bytes.Clone(c.Image)
		if len(img) < 0x18 {
			return nil, errors.New("the kernels' cubin is truncated")
		}
		img[elf.EI_VERSION] = byte(elf.EV_CURRENT)
		binary.LittleEndian.PutUint32(img[0x14:], uint32(elf.EV_CURRENT))
		f, err := elf.NewFile(bytes.NewReader(img))
		if err != nil {
			return nil, errors.Wrap(err, "reading the kernels' cubin")
		}
		syms, err := f.Symbols()
		if err != nil {
			return nil, errors.Wrap(err, "reading the kernels' cubin symbols")
		}
		var out []string
		for _, s := range syms {
			if elf.ST_TYPE(s.Info) == elf.STT_FUNC && elf.ST_BIND(s.Info) == elf.STB_GLOBAL && s.Name != "" {
				out = append(out, s.Name)
			}
		}
		return out, nil
	}
	var out []string
	for _, m := range ptxEntry.FindAllSubmatch(c.Image, -1) {
		out = append(out, string(m[1]))
	}
	return out, nil
}

var ptxEntry = regexp.MustCompile(`\.entry\s+([A-Za-z_$][\w$]*)`)

// Preload loads every kernel of the module now. With lazy module loading
// (the driver's default) a kernel's first launch loads it, and a load may
// wait for the device to go idle: a peer-barrier kernel spinning until
// another rank's launch from the same process signals it would then never
// finish. Ranks on several GPUs (or streams) preload before their first
// barrier.
func (k *Set) Preload() error {
	names, err := KernelNames(k.Build)
	if err != nil {
		return err
	}
	for _, n := range names {
		if _, err := k.fn(n); err != nil {
			var ce *cuda.CUDAError
			if errors.As(err, &ce) && ce.Name == "CUDA_ERROR_NOT_FOUND" {
				continue // a device function's symbol, not an entry point
			}
			return errors.Wrapf(err, "preloading kernel %s", n)
		}
	}
	return nil
}

// PeerWait is bar alone over grid blocks (slots 0..grid-1): a rank's part
// in a collective launched by its peers with a grid of that many blocks.
func (k *Set) PeerWait(s cuda.Stream, grid int, bar PeerBarrier) error {
	if bar.Flags == 0 || grid < 1 || grid > CommMaxSlots {
		return errors.Newf("peer_wait: grid %d, flags %#x", grid, uint64(bar.Flags))
	}
	return k.launch("peer_wait", cuda.D1(grid), cuda.D1(32), 0, s, int32(bar.Ranks), bar.Flags, bar.Table, int32(bar.Rank))
}

// AllReduceToGrid is the grid AllReduceTo launches for n floats (a rank
// that only waits matches it with PeerWait).
func AllReduceToGrid(n int) int { return min(cdiv(n, 256), CommMaxSlots) }
