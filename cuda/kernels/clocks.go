package kernels

import (
	"encoding/binary"
	"sort"
	"strings"

	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/cuda"
)

// BlockClocks compiles every module with TILERT_BLOCK_CLOCKS (common.cuh):
// each kernel that starts with PDL_WAIT() records, per block, the
// %globaltimer at its entry, after its wait and at its exit, once armed
// (ArmBlockClocks). A diagnostic build: the kernels keep their bits, but
// thread 0 of every block takes an atomic and a few stores, and the
// options are part of the kernel cache's key. The engine sets it from
// TILERT_GPU_BLOCK_CLOCKS=1 before its first Load.
var BlockClocks = false

// clocksNeed refuses block clocks with an NVRTC older than 12: NVRTC 11.8
// crashes (SIGSEGV inside nvrtcCompileProgram) on the default module built
// with them (session 52, Debian's libnvrtc11.2).
func clocksNeed(nv *cuda.NVRTC) error {
	if BlockClocks && nv.Major < 12 {
		return errors.WithHintf(errors.Newf("block clocks need NVRTC 12 or newer; this is %s (%s)", nv.Version(), nv.Lib),
			"set TILERT_NVRTC to a libnvrtc.so.12 or newer, or unset TILERT_GPU_BLOCK_CLOCKS")
	}
	return nil
}

// BlockClockWords is one record's size in uint64 words (common.cuh).
const BlockClockWords = 5

// BlockClock is one block's record: the kernel by the hash of its name
// (NameHash) and grid size, the block's linear index and SM, and three
// %globaltimer readings (ns). A marks record (NameHash MarksTag, from a
// kernel opened by PDL_WAIT_MARKED) has no times of its own but Marks: when
// thread 0 passed BLOCK_MARK(i), 0 where it did not.
type BlockClock struct {
	NameHash uint32
	Blocks   uint32 // the grid's blocks
	Block    uint32
	SM       uint32
	Entry    uint64 // thread 0 began (the block was resident)
	Released uint64 // past griddepcontrol.wait
	Exit     uint64 // thread 0 left the kernel
	Marks    [MarksMax]uint64
}

// MarksTag is a marks record's name word ("mark", common.cuh's
// TilertMarks); MarksMax the marks a block may take.
const (
	MarksTag = 0x6d61726b
	MarksMax = 8
)

// markLabels names the marks of the kernels that take them (common.cuh's
// BLOCK_MARK(i) is label i), by kernel name prefix.
var markLabels = map[string][]string{
	// tkw_body / tkw_core (topk_radix.cu).
	"topk_radix_one_w": {"hist + lens in", "bin found", "keys mapped", "digit 1 picked", "digit 2 picked", "emit counted", "stored"},
	// wgh_body (wg/scores_wgh.cu).
	"indexer_scores_wgh": {"query staged", "keys scored", "histogram added"},
	// attn_epilogue_body's block 0 (the latent row and the indexer key),
	// idx_q_prep_t's blocks 1.. (the indexer query; fused.cu, indexer_mma.cu).
	"attn_epilogue": {"kv / key in", "kv / key normed", "kv / key stored", "query in", "query scaled", "query stored"},
	"idx_q_prep":    {"", "", "", "query in", "query scaled", "query stored"},
	// qb_absorb_body (absorb/qb_absorb.cu; with two blocks a head, q_b's
	// half summed before the cluster's exchange).
	"qb_absorb": {"q_b summed", "q_a scale", "absorbed"},
}

// MarkLabels gives the labels of a kernel's marks by index (nil: it takes
// none).
func MarkLabels(kernel string) []string {
	best := ""
	for p := range markLabels {
		if strings.HasPrefix(kernel, p) && len(p) > len(best) {
			best = p
		}
	}
	if best == "" {
		return nil
	}
	return markLabels[best]
}

// NameHash is the 32-bit FNV-1a of a kernel's name, as the kernels hash
// their __func__.
func NameHash(name string) uint32 {
	h := uint32(2166136261)
	for i := 0; i < len(name); i++ {
		h = (h ^ uint32(name[i])) * 16777619
	}
	return h
}

// decodeClocks reads n records from their little-endian words, dropping any
// whose exit was never written (a block still running, or a kernel whose
// PDL_WAIT ran in a helper that returned).
func decodeClocks(words []byte, n int) []BlockClock {
	out := make([]BlockClock, 0, n)
	for i := 0; i < n; i++ {
		w := func(j int) uint64 { return binary.LittleEndian.Uint64(words[8*(BlockClockWords*i+j):]) }
		r := BlockClock{NameHash: uint32(w(0)), Blocks: uint32(w(0) >> 32), Block: uint32(w(1)), SM: uint32(w(1) >> 32),
			Entry: w(2), Released: w(3), Exit: w(4)}
		if r.NameHash == MarksTag && r.Blocks != 0 && i+1 < n {
			// Two records: the header's last three words and the next
			// record's five are marks 0..7.
			r.Entry, r.Released, r.Exit = 0, 0, 0
			for m := range MarksMax {
				r.Marks[m] = w(2 + m)
			}
			i++
			out = append(out, r)
			continue
		}
		if r.Exit == 0 || r.Released < r.Entry || r.Exit < r.Released {
			continue
		}
		out = append(out, r)
	}
	return out
}

// SplitRuns sorts cs by entry and says whether each run of n records
// holds every block index below n once: the blocks of one launch after
// another, as launches of one kernel and grid size that do not overlap
// leave them (a false: they overlapped, or records were lost).
func SplitRuns(cs []BlockClock, n int) bool {
	if n <= 0 || len(cs)%n != 0 {
		return false
	}
	sort.SliceStable(cs, func(a, b int) bool { return cs[a].Entry < cs[b].Entry })
	seen := make([]bool, n)
	for lo := 0; lo < len(cs); lo += n {
		clear(seen)
		for _, c := range cs[lo : lo+n] {
			if int(c.Block) >= n || seen[c.Block] {
				return false
			}
			seen[c.Block] = true
		}
	}
	return true
}

// clockGlobals are one module's block-clock variables.
type clockGlobals struct{ buf, capacity, n cuda.DevPtr }

func (k *Set) clockGlobals() ([]clockGlobals, error) {
	if !BlockClocks {
		return nil, errors.WithHint(errors.New("the kernels were compiled without block clocks"),
			"set TILERT_GPU_BLOCK_CLOCKS=1 before the engine loads")
	}
	var out []clockGlobals
	mods := k.c.Modules()
	names := make([]string, 0, len(mods))
	for n := range mods {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, name := range names {
		g, err := moduleClockGlobals(k.c, name, mods[name])
		if err != nil {
			return nil, err
		}
		out = append(out, g)
	}
	return out, nil
}

// moduleClockGlobals finds one module's block-clock variables.
func moduleClockGlobals(c *cuda.Ctx, name string, m *cuda.Module) (clockGlobals, error) {
	var g clockGlobals
	for _, v := range []struct {
		p    *cuda.DevPtr
		name string
		size int64
	}{{&g.buf, "tilert_clocks", 8}, {&g.capacity, "tilert_clocks_cap", 4}, {&g.n, "tilert_clocks_n", 4}} {
		p, size, err := c.ModuleGlobal(m, v.name)
		if err != nil {
			return g, errors.WithHint(errors.Wrapf(err, "module %s", name),
				"every module must be compiled with TILERT_BLOCK_CLOCKS: set TILERT_GPU_BLOCK_CLOCKS=1 before the engine loads")
		}
		if size != v.size {
			return g, errors.Newf("module %s: %s is %d bytes, want %d", name, v.name, size, v.size)
		}
		*v.p = p
	}
	return g, nil
}

// arm points g at p (capacity records; 0: off) and zeroes its count.
func (g clockGlobals) arm(c *cuda.Ctx, p cuda.DevPtr, capacity int) (ClockShare, error) {
	if err := c.Upload(g.buf, []uint64{uint64(p)}); err != nil {
		return ClockShare{}, err
	}
	if err := c.Upload(g.capacity, []uint32{uint32(capacity)}); err != nil {
		return ClockShare{}, err
	}
	if err := c.Upload(g.n, []uint32{0}); err != nil {
		return ClockShare{}, err
	}
	return ClockShare{g: g, at: p, capacity: capacity}, nil
}

// ArmBlockClocks points the block clocks of every module loaded so far at
// buf, which holds capacity records, zeroed, and zeroes their counts; buf 0
// disarms them. Each module counts its own records, so buf is split evenly
// between them. Call it with the device idle; a module loaded later is not
// armed.
func (k *Set) ArmBlockClocks(buf cuda.DevPtr, capacity int) ([]ClockShare, error) {
	gs, err := k.clockGlobals()
	if err != nil {
		return nil, err
	}
	if buf != 0 {
		if err := k.c.MemsetD8(buf, 0, int64(capacity*BlockClockWords*8), k.c.Stream()); err != nil {
			return nil, err
		}
	}
	per := capacity / max(len(gs), 1)
	var shares []ClockShare
	for i, g := range gs {
		p, c := cuda.DevPtr(0), 0
		if buf != 0 {
			p, c = buf+cuda.DevPtr(i*per*BlockClockWords*8), per
		}
		s, err := g.arm(k.c, p, c)
		if err != nil {
			return nil, err
		}
		shares = append(shares, s)
	}
	return shares, nil
}

// ClockShare is one module's part of an armed clock buffer.
type ClockShare struct {
	g        clockGlobals
	at       cuda.DevPtr
	capacity int
}

// ReadBlockClocks returns the records the armed shares took (after the
// device finished the work) and how many were lost to a full buffer.
func (k *Set) ReadBlockClocks(shares []ClockShare) ([]BlockClock, int, error) {
	return readClocks(k.c, shares)
}

func readClocks(c *cuda.Ctx, shares []ClockShare) ([]BlockClock, int, error) {
	var out []BlockClock
	lost := 0
	for _, s := range shares {
		n := []uint32{0}
		if err := c.Download(n, s.g.n); err != nil {
			return nil, 0, err
		}
		got := min(int(n[0]), s.capacity)
		lost += int(n[0]) - got
		if got == 0 {
			continue
		}
		words := make([]byte, got*BlockClockWords*8)
		if err := c.Download(words, s.at); err != nil {
			return nil, 0, err
		}
		out = append(out, decodeClocks(words, got)...)
	}
	return out, lost, nil
}
