package kernels

import (
	"encoding/binary"
	"math/rand/v2"
	"regexp"
	"strings"
	"testing"

	"github.com/tilert-go/tilert/cuda"
)

func TestNameHash(t *testing.T) {
	for _, c := range []struct {
		name string
		want uint32
	}{
		{"", 0x811c9dc5}, // FNV-1a's offset basis
		{"a", 0xe40c292c},
		{"foobar", 0xbf9cf968},
	} {
		if got := NameHash(c.name); got != c.want {
			t.Errorf("NameHash(%q) = %#x, want %#x", c.name, got, c.want)
		}
	}
}

func TestDecodeClocks(t *testing.T) {
	rec := func(h, n, blk, sm uint32, in, rel, out uint64) []uint64 {
		return []uint64{uint64(h) | uint64(n)<<32, uint64(blk) | uint64(sm)<<32, in, rel, out}
	}
	var words []uint64
	for _, r := range [][]uint64{
		rec(7, 128, 5, 131, 100, 150, 400), // kept
		rec(7, 128, 6, 0, 100, 150, 0),     // no exit: still running or never closed
		rec(9, 2, 1, 3, 200, 190, 300),     // released before entry: garbage
		rec(9, 2, 0, 4, 200, 210, 205),     // exit before release
		rec(9, 2, 1, 2, 10, 10, 10),        // zero-length is fine
		// A marks header and its second record (marks 0..7: 11, 12, 0, 14, ..).
		rec(MarksTag, 64, 3, 9, 11, 12, 0), {14, 15, 16, 17, 18},
		rec(9, 2, 0, 2, 20, 20, 30), // after them, a block again
	} {
		words = append(words, r...)
	}
	b := make([]byte, 8*len(words))
	for i, w := range words {
		binary.LittleEndian.PutUint64(b[8*i:], w)
	}
	got := decodeClocks(b, 8)
	want := []BlockClock{
		{NameHash: 7, Blocks: 128, Block: 5, SM: 131, Entry: 100, Released: 150, Exit: 400},
		{NameHash: 9, Blocks: 2, Block: 1, SM: 2, Entry: 10, Released: 10, Exit: 10},
		{NameHash: MarksTag, Blocks: 64, Block: 3, SM: 9, Marks: [MarksMax]uint64{11, 12, 0, 14, 15, 16, 17, 18}},
		{NameHash: 9, Blocks: 2, Block: 0, SM: 2, Entry: 20, Released: 20, Exit: 30},
	}
	if len(got) != len(want) {
		t.Fatalf("decoded %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("record %d: %+v, want %+v", i, got[i], want[i])
		}
	}
}

// The block-clock build compiles, and every kernel that starts with
// PDL_WAIT reads the global timer in it (PTX only: the entries' bodies).
// Needs NVRTC (skipped without); the sm_90a module needs NVRTC 12+.
func TestBlockClocksCompile(t *testing.T) {
	nv, err := cuda.LoadNVRTC()
	if err != nil {
		t.Skipf("no NVRTC here, compile check skipped: %v", err)
	}
	if testing.Short() {
		t.Skip("-short: five module compiles")
	}
	defer func(v bool) { BlockClocks = v }(BlockClocks)
	BlockClocks = true
	if err := clocksNeed(nv); err != nil {
		t.Skipf("%v (set TILERT_NVRTC to check the block-clock build here)", err)
	}
	mods := []struct {
		name, src, arch string
	}{
		{"tilert_kernels.cu", KernelSource(), "sm_90"},
		{"tilert_kernels_absorb.cu", AbsorbKernelSource(), "sm_90"},
		{"tilert_kernels_few.cu", FewKernelSource(), "sm_90"},
		{"tilert_kernels_mid.cu", MidKernelSource(), "sm_90"},
		{"tilert_kernels_wg.cu", WGKernelSource(), "sm_90a"},
	}
	entry := regexp.MustCompile(`(?m)^\.visible \.entry (\w+)\(`)
	timed := 0
	for _, m := range mods {
		if m.arch == "sm_90a" && !nv.CanCompileSM90a() {
			t.Logf("NVRTC %s cannot compile sm_90a: %s not checked", nv.Version(), m.name)
			continue
		}
		ptx, log, err := nv.CompileLog(m.src, m.name, kernelOptions(m.arch), false)
		if err != nil {
			t.Fatalf("%s with TILERT_BLOCK_CLOCKS: %v\n%s", m.name, err, log)
		}
		s := string(ptx)
		if !strings.Contains(s, "tilert_clocks") {
			t.Errorf("%s: no tilert_clocks global in the PTX", m.name)
		}
		locs := entry.FindAllStringSubmatchIndex(s, -1)
		for i, l := range locs {
			name := s[l[2]:l[3]]
			end := len(s)
			if i+1 < len(locs) {
				end = locs[i+1][0]
			}
			body := s[l[0]:end]
			if !pdlKernels[name] && !pdlWeightsFirst[name] {
				continue
			}
			if !strings.Contains(body, "%globaltimer") || !strings.Contains(body, "griddepcontrol.wait") {
				t.Errorf("%s: %s is launched programmatically but reads no %%globaltimer around its wait", m.name, name)
			}
			timed++
		}
	}
	if timed == 0 {
		t.Fatal("no programmatic kernel found in the PTX")
	}
	t.Logf("%d programmatic kernels read the timer", timed)
}

// clockProbeSource is common.cuh and one programmatic kernel that spins a
// while, to take block clocks of.
func clockProbeSource() string {
	common, err := kernelFS.ReadFile("cu/common.cuh")
	if err != nil {
		panic(err)
	}
	return string(common) + `
extern "C" __global__ void clock_probe(float* x, int spins) {
  PDL_WAIT();
  float a = x[blockIdx.x];
  for (int i = 0; i < spins; ++i) a = a * 1.0001f + 1.0f;
  if (threadIdx.x == 0) x[blockIdx.x] = a;
}
extern "C" __global__ void clock_probe_marked(float* x, int spins) {
  PDL_WAIT_MARKED();
  float a = x[blockIdx.x];
  BLOCK_MARK(0);
  for (int i = 0; i < spins; ++i) a = a * 1.0001f + 1.0f;
  BLOCK_MARK(1);
  if (threadIdx.x == 0) x[blockIdx.x] = a;
}
`
}

// withClockProbe builds clockProbeSource with block clocks (skipping where
// NVRTC cannot) and gives run a function that launches kernel fn of it twice
// programmatically over blocks blocks and returns the records taken.
func withClockProbe(t *testing.T, fn string, blocks int, run func(c *cuda.Ctx, info cuda.DeviceInfo, launch func() ([]BlockClock, int))) {
	gpuDevice(t)
	defer func(v bool) { BlockClocks = v }(BlockClocks)
	BlockClocks = true
	nv, err := cuda.LoadNVRTC()
	if err != nil {
		t.Skip(err)
	}
	if err := clocksNeed(nv); err != nil {
		t.Skip(err)
	}
	onGPU(t, func(c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand) {
		info := c.Info()
		ck, err := cuda.CompileModule(nv, info.CCMajor, info.CCMinor, clockProbeSource(), "clock_probe.cu", kernelOptions, cuda.DefaultKernelCache())
		chk(err)
		m, err := c.LoadModule("clock_probe", ck.Image)
		chk(err)
		f, err := c.Function(m, fn)
		chk(err)
		g, err := moduleClockGlobals(c, "clock_probe", m)
		chk(err)
		capacity := max(4096, 4*blocks)
		buf := a.raw(int64(capacity * BlockClockWords * 8))
		chk(c.MemsetD8(buf, 0, int64(capacity*BlockClockWords*8), c.Stream()))
		share, err := g.arm(c, buf, capacity)
		chk(err)
		x := a.up(make([]float32, blocks))
		run(c, info, func() ([]BlockClock, int) {
			for range 2 {
				chk(c.LaunchEx(f, cuda.D1(blocks), cuda.D1(128), 0, c.Stream(), true, x, 2000+r.IntN(1000)))
			}
			chk(c.SyncStream(c.Stream()))
			cl, lost, err := readClocks(c, []ClockShare{share})
			chk(err)
			_, err = g.arm(c, 0, 0)
			chk(err)
			return cl, lost
		})
	})
}

// TestGPUBlockMarks: a probe opened by PDL_WAIT_MARKED with two marks, two
// programmatic launches: a block record and a marks record per block, each
// marks record on its block's SM and index with mark 0 <= mark 1 inside its
// block's release .. exit, marks 2..7 untaken.
func TestGPUBlockMarks(t *testing.T) {
	const blocks = 8
	withClockProbe(t, "clock_probe_marked", blocks, func(c *cuda.Ctx, info cuda.DeviceInfo, launch func() ([]BlockClock, int)) {
		cl, lost := launch()
		var bs, ms []BlockClock
		for _, b := range cl {
			if b.NameHash == MarksTag {
				ms = append(ms, b)
			} else {
				bs = append(bs, b)
			}
		}
		if len(bs) != 2*blocks || len(ms) != 2*blocks || lost != 0 {
			t.Fatalf("%d block records, %d marks records (%d lost), want %d each", len(bs), len(ms), lost, 2*blocks)
		}
		for _, mk := range ms {
			found := false
			for _, b := range bs {
				if b.Block == mk.Block && b.SM == mk.SM && mk.Blocks == blocks && b.Released <= mk.Marks[0] && mk.Marks[0] <= mk.Marks[1] && mk.Marks[1] <= b.Exit {
					found = true
				}
			}
			if !found || mk.Marks[2] != 0 || mk.Marks[MarksMax-1] != 0 {
				t.Fatalf("marks record %+v has no block it ran in (or took marks it did not pass): blocks %+v", mk, bs)
			}
		}
		t.Logf("marks 0 -> 1: %d ns in block 0", ms[0].Marks[1]-ms[0].Marks[0])
	})
}

// TestGPUBlockClocks: two programmatic launches of a probe built with block
// clocks give a record per block each, every block index once a launch,
// entry <= release <= exit, and no block of the second launch released
// before the first launch's last block left (the PDL wait).
func TestGPUBlockClocks(t *testing.T) {
	const blocks = 3 * 132
	withClockProbe(t, "clock_probe", blocks, func(c *cuda.Ctx, info cuda.DeviceInfo, launch func() ([]BlockClock, int)) {
		cl, lost := launch()
		if len(cl) != 2*blocks || lost != 0 {
			t.Fatalf("%d records (%d lost), want %d", len(cl), lost, 2*blocks)
		}
		h := NameHash("clock_probe")
		for _, b := range cl {
			if b.NameHash != h || b.Blocks != blocks || int(b.SM) >= info.SMs || b.Entry > b.Released || b.Released > b.Exit {
				t.Fatalf("record %+v (name hash want %#x, %d blocks, SMs < %d)", b, h, blocks, info.SMs)
			}
		}
		if !SplitRuns(cl, blocks) {
			t.Fatal("the records do not split into two launches of every block once")
		}
		var lastOut, firstRel uint64
		for _, b := range cl[:blocks] {
			lastOut = max(lastOut, b.Exit)
		}
		firstRel = cl[blocks].Released
		for _, b := range cl[blocks:] {
			firstRel = min(firstRel, b.Released)
		}
		if firstRel < lastOut {
			t.Errorf("a block of the second launch was released at %d, before the first launch's last exit at %d", firstRel, lastOut)
		}
		t.Logf("first launch: blocks in %d ns, out %d ns after the first entry; second released %d ns after the first's last exit (PDL %v)",
			cl[blocks-1].Entry-cl[0].Entry, lastOut-cl[0].Entry, firstRel-lastOut, c.PDLSupported())
	})
}

func TestSplitRuns(t *testing.T) {
	bc := func(blk uint32, in uint64) BlockClock { return BlockClock{Block: blk, Entry: in} }
	for _, c := range []struct {
		name string
		cs   []BlockClock
		n    int
		want bool
	}{
		{"two launches, entries out of order", []BlockClock{bc(1, 11), bc(0, 1), bc(0, 10), bc(1, 2)}, 2, true},
		{"a block twice in a run", []BlockClock{bc(0, 1), bc(0, 2), bc(1, 10), bc(1, 11)}, 2, false},
		{"overlapping launches", []BlockClock{bc(0, 1), bc(0, 2), bc(1, 3), bc(1, 4)}, 2, false},
		{"an index past the grid", []BlockClock{bc(0, 1), bc(2, 2)}, 2, false},
		{"a record lost", []BlockClock{bc(0, 1), bc(1, 2), bc(0, 10)}, 2, false},
	} {
		if got := SplitRuns(c.cs, c.n); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}
