package kernels

// GPU kernel checks: each kernel against its CPU reference on fresh random
// inputs, outputs poisoned (NaN) first so an unwritten element fails. They
// skip without a GPU. TILERT_GPU_SEED fixes the inputs; TILERT_GPU_REPORT
// names a file for the check table (scripts/gpu-check.sh).

import (
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/cuda"
	"github.com/tilert-go/tilert/cuda/cudatest"
)

var (
	reportMu   sync.Mutex
	reportRows []checkRow
	timingRows []timingRow
)

type checkRow struct {
	Name   string
	Metric string
	Err    float64
	Bound  float64
	Pass   bool
}

type timingRow struct {
	Name    string
	Bytes   float64
	Median  float64 // microseconds
	GBps    float64
	OfCopy  float64 // fraction of the measured copy bandwidth
	Comment string
}

func TestMain(m *testing.M) {
	code := m.Run()
	if err := cudatest.Close(); err != nil {
		fmt.Fprintf(os.Stderr, "closing the device: %+v\n", err)
		code = 1
	}
	if err := writeReport(); err != nil {
		fmt.Fprintf(os.Stderr, "report: %v\n", err)
		code = 1
	}
	os.Exit(code)
}

// gpuDevice is GPU 0 (cuda/cudatest), or skips the test without one.
func gpuDevice(t testing.TB) *cuda.Device {
	t.Helper()
	return cudatest.Device(t)
}

func testSeed(t testing.TB) uint64 {
	if v := os.Getenv("TILERT_GPU_SEED"); v != "" {
		s, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("TILERT_GPU_SEED=%q: %v", v, err)
		}
		return s
	}
	return uint64(time.Now().UnixNano())
}

// chk panics on error; Device.Do turns the panic into the closure's error
// (t.Fatal must not run on the device thread: it would end that goroutine).
func chk(err error) {
	if err != nil {
		panic(err)
	}
}

type allocs struct {
	c    *cuda.Ctx
	ptrs []cuda.DevPtr
}

func (a *allocs) raw(n int64) cuda.DevPtr {
	p, err := a.c.Alloc(n)
	chk(err)
	a.ptrs = append(a.ptrs, p)
	return p
}

func (a *allocs) up(data any) cuda.DevPtr {
	b, err := cuda.BytesOf(data)
	chk(err)
	p := a.raw(int64(max(len(b), 4)))
	chk(a.c.Upload(p, data))
	return p
}

// poisoned allocates n 32-bit words filled with a quiet NaN (as int32 it is
// 2143289344, never a valid index).
func (a *allocs) poisoned(n int) cuda.DevPtr {
	p := a.raw(int64(4 * n))
	chk(a.c.MemsetD32(p, 0x7fc00000, int64(n), a.c.Stream()))
	return p
}

func (a *allocs) free() {
	for _, p := range a.ptrs {
		_ = a.c.Free(p)
	}
	a.ptrs = nil
}

func downF32(c *cuda.Ctx, p cuda.DevPtr, n int) []float32 {
	out := make([]float32, n)
	chk(c.Download(out, p))
	return out
}

func downI32(c *cuda.Ctx, p cuda.DevPtr, n int) []int32 {
	out := make([]int32, n)
	chk(c.Download(out, p))
	return out
}

// onGPU runs f on the device thread with the kernels loaded and fresh
// random numbers.
func onGPU(t *testing.T, f func(c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand)) {
	t.Helper()
	d := gpuDevice(t)
	seed := testSeed(t)
	t.Logf("seed %d", seed)
	err := d.Do(func(c *cuda.Ctx) error {
		k, err := Load(c)
		if err != nil {
			return err
		}
		a := &allocs{c: c}
		defer a.free()
		f(c, k, a, rand.New(rand.NewPCG(seed, 0x7113)))
		return c.SyncStream(c.Stream())
	})
	endLikeDeviceThread(t, err)
}

// endLikeDeviceThread ends the test as f did on the device thread: a
// t.Skip or t.Fatal there ends only that goroutine (Do then returns
// cuda.ErrGoexit), so the test goroutine skips or fails here in turn.
func endLikeDeviceThread(t *testing.T, err error) {
	t.Helper()
	switch {
	case errors.Is(err, cuda.ErrGoexit) && t.Skipped():
		t.SkipNow()
	case errors.Is(err, cuda.ErrGoexit):
		t.FailNow()
	case err != nil:
		t.Fatalf("%+v", err)
	}
}

func record(t *testing.T, name, metric string, err, bound float64) {
	t.Helper()
	pass := err <= bound && !math.IsNaN(err)
	reportMu.Lock()
	reportRows = append(reportRows, checkRow{name, metric, err, bound, pass})
	reportMu.Unlock()
	if !pass {
		t.Errorf("%s: %s = %.3g, bound %.3g", name, metric, err, bound)
	} else {
		t.Logf("%s: %s = %.3g (bound %.3g)", name, metric, err, bound)
	}
}

const (
	boundF32 = 1e-5 // float32 arithmetic on exact (fp8/bf16/f32) inputs
	// boundTC: mla_decode_tc's products are float32-exact (three bf16 parts
	// of the queries and probabilities, exact cache values), summed inside
	// the tensor cores' own accumulation order.
	boundTC   = 2e-5
	relMetric = "max|d|/max|ref|"
)

func TestDeviceInfoAndExecutor(t *testing.T) {
	d := gpuDevice(t)
	i := d.Info
	t.Logf("%s %s, %d SMs, %d MiB, L2 %d KiB, driver %d (%s)", i.Name, i.Arch(), i.SMs, i.TotalMem>>20, i.L2Bytes>>10, i.DriverVersion, i.DriverLib)
	if i.SMs <= 0 || i.TotalMem <= 0 || i.CCMajor <= 0 {
		t.Fatalf("implausible device info %+v", i)
	}
	// Many goroutines share the one device thread.
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for g := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- d.Do(func(c *cuda.Ctx) error {
				p, err := c.Alloc(4096)
				if err != nil {
					return err
				}
				defer c.Free(p)
				in := make([]int32, 1024)
				for j := range in {
					in[j] = int32(g*10000 + j)
				}
				if err := c.Upload(p, in); err != nil {
					return err
				}
				out := make([]int32, 1024)
				if err := c.Download(out, p); err != nil {
					return err
				}
				for j := range out {
					if out[j] != in[j] {
						return errors.Newf("goroutine %d: word %d = %d", g, j, out[j])
					}
				}
				return nil
			})
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	// A panic comes back as an error and the device keeps working.
	if err := d.Do(func(c *cuda.Ctx) error { panic("boom") }); err == nil || !strings.Contains(err.Error(), "boom") {
		t.Errorf("panic not reported: %v", err)
	}
	if err := d.Do(func(c *cuda.Ctx) error { return c.Synchronize() }); err != nil {
		t.Errorf("device unusable after a panic: %v", err)
	}
	// Pinned memory round trip through async copies.
	err := d.Do(func(c *cuda.Ctx) error {
		h, err := c.HostAlloc(1 << 20)
		if err != nil {
			return err
		}
		defer c.FreeHost(h)
		for j := range h.Bytes {
			h.Bytes[j] = byte(j * 7)
		}
		p, err := c.Alloc(1 << 20)
		if err != nil {
			return err
		}
		defer c.Free(p)
		if err := c.CopyHtoDAsync(p, h.Bytes, c.Stream()); err != nil {
			return err
		}
		back := make([]byte, 1<<20)
		if err := c.Download(back, p); err != nil {
			return err
		}
		for j := range back {
			if back[j] != byte(j*7) {
				return errors.Newf("pinned round trip byte %d", j)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("%+v", err)
	}
}

// ---- GEMV ----

func TestKernelGemv(t *testing.T) {
	for _, rows := range []int{1, 2, 4} {
		t.Run(fmt.Sprintf("rows_per_warp=%d", rows), func(t *testing.T) {
			forceGemvRows = rows
			defer func() { forceGemvRows = 0 }()
			testGemv(t, fmt.Sprintf(" R=%d", rows))
		})
	}
}

func testGemv(t *testing.T, tag string) {
	onGPU(t, func(c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand) {
		s := c.Stream()
		fp8Cases := []gemvCase{{576, 7168, 1, 0, false}, {200, 96, 2, 0, true}, {130, 100, 3, 0, false}, {1536, 1536, 4, 0, true}, {300, 2112, 1, 0, true}}
		for _, cs := range fp8Cases {
			checkGemvFP8(t, c, a, r, k.GemvFP8, cs, fmt.Sprintf("gemv_fp8 N=%d K=%d M=%d", cs.N, cs.K, cs.M)+tag, false)
		}
		for _, cs := range []gemvCase{{129, 7168, 1, 0, false}, {256, 200, 4, 0, true}, {50, 37, 2, 0, false}} {
			checkGemvBF16(t, c, a, r, k.GemvBF16, cs, fmt.Sprintf("gemv_bf16 N=%d K=%d M=%d", cs.N, cs.K, cs.M)+tag)
		}
		{
			N, K, M := 100, 300, 2
			w := randF32(r, N*K, 0.05)
			x := randF32(r, M*K, 1)
			yp := a.poisoned(M * N)
			chk(k.GemvF32(s, yp, a.up(x), a.up(w), 0, N, K, M, K, N))
			ref := refGemv(func(n, kk int) float64 { return float64(w[n*K+kk]) }, x, nil, N, K, M, K, N)
			record(t, fmt.Sprintf("gemv_f32 N=%d K=%d M=%d", N, K, M)+tag, relMetric, relErr(downF32(c, yp, M*N), ref), boundF32)
		}
		// Routed experts through device pointer tables.
		for _, shared := range []bool{true, false} {
			const E, slots, N, K = 6, 4, 200, 384
			ex := randFP8Experts(r, a, E, N, K)
			ids := []int32{int32(r.IntN(E)), int32(r.IntN(E)), 2, 2}
			xstride := K
			x := randF32(r, slots*K, 1)
			if shared {
				xstride = 0
			}
			checkGemvExperts(t, c, a, k.GemvFP8Experts, ex, ids, x, xstride, N, fmt.Sprintf("gemv_fp8_experts slots=%d shared_x=%v", slots, shared)+tag)
		}
	})
}

// ---- norms, rope, element-wise ----

func TestKernelNormRopeElementwise(t *testing.T) {
	onGPU(t, func(c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand) {
		s := c.Stream()
		for _, cs := range [][2]int{{3, 7168}, {1, 1536}, {2, 100}} {
			rows, D := cs[0], cs[1]
			x := randF32(r, rows*D, 2)
			w := randF32(r, D, 1)
			yp := a.poisoned(rows * D)
			chk(k.RMSNorm(s, yp, a.up(x), a.up(w), rows, D, D, D, 1e-6))
			record(t, fmt.Sprintf("rmsnorm rows=%d D=%d", rows, D), relMetric, relErr(downF32(c, yp, rows*D), refRMSNorm(x, w, rows, D, 1e-6)), boundF32)
		}
		// Fused residual add + RMSNorm: x must equal float32(x+b) exactly, y
		// the reference norm of it, and both bit-identical to Add then RMSNorm.
		for _, cs := range [][2]int{{4, 7168}, {1, 1536}, {3, 100}} {
			rows, D := cs[0], cs[1]
			x := randF32(r, rows*D, 2)
			b := randF32(r, rows*D, 2)
			w := randF32(r, D, 1)
			sum := make([]float32, rows*D)
			for i := range sum {
				sum[i] = x[i] + b[i]
			}
			xp, bp, yp := a.up(x), a.up(b), a.poisoned(rows*D)
			chk(k.AddRMSNorm(s, yp, xp, bp, a.up(w), rows, D, D, D, D, 1e-6))
			gx, gy := downF32(c, xp, rows*D), downF32(c, yp, rows*D)
			diff := 0
			for i := range sum {
				if math.Float32bits(gx[i]) != math.Float32bits(sum[i]) {
					diff++
				}
			}
			name := fmt.Sprintf("add_rmsnorm rows=%d D=%d", rows, D)
			record(t, name+" residual", "elements != float32 x+b", float64(diff), 0)
			record(t, name, relMetric, relErr(gy, refRMSNorm(sum, w, rows, D, 1e-6)), boundF32)
			x2p, y2p := a.up(x), a.poisoned(rows*D)
			chk(k.Add(s, x2p, x2p, bp, rows*D))
			chk(k.RMSNorm(s, y2p, x2p, a.up(w), rows, D, D, D, 1e-6))
			g2 := downF32(c, y2p, rows*D)
			diff = 0
			for i := range g2 {
				if math.Float32bits(g2[i]) != math.Float32bits(gy[i]) {
					diff++
				}
			}
			record(t, name+" == add+rmsnorm", "elements differing in bits", float64(diff), 0)
		}
		for _, cs := range []struct {
			rows, D int
			bias    bool
		}{{4, 128, true}, {2, 7168, false}} {
			x := randF32(r, cs.rows*cs.D, 1)
			for i := range x {
				x[i] += 3 // an offset the mean must remove
			}
			w := randF32(r, cs.D, 1)
			var b []float32
			bp := cuda.DevPtr(0)
			if cs.bias {
				b = randF32(r, cs.D, 1)
				bp = a.up(b)
			}
			yp := a.poisoned(cs.rows * cs.D)
			chk(k.LayerNorm(s, yp, a.up(x), a.up(w), bp, cs.rows, cs.D, cs.D, cs.D, 1e-6))
			record(t, fmt.Sprintf("layernorm rows=%d D=%d bias=%v", cs.rows, cs.D, cs.bias), relMetric,
				relErr(downF32(c, yp, cs.rows*cs.D), refLayerNorm(x, w, b, cs.rows, cs.D, 1e-6)), boundF32)
		}
		// RoPE: main attention (interleaved, rope dims after 128 nope dims of
		// 16 heads) and indexer (half-split, first 64 of 128, one row a token).
		for _, cs := range []struct {
			name                           string
			toks, rowsPerTok, ld, off, rot int
			interleaved                    bool
		}{
			{"rope interleaved (MLA q_pe)", 3, 16, 192, 128, 64, true},
			{"rope half-split (indexer k)", 5, 1, 128, 0, 64, false},
		} {
			const maxPos = 4096
			half := cs.rot / 2
			cosT, sinT := make([]float32, maxPos*half), make([]float32, maxPos*half)
			for p := range maxPos {
				for i := range half {
					ang := float64(p) * math.Pow(10000, -2*float64(i)/float64(cs.rot))
					cosT[p*half+i], sinT[p*half+i] = float32(math.Cos(ang)), float32(math.Sin(ang))
				}
			}
			pos := make([]int32, cs.toks)
			for i := range pos {
				pos[i] = int32(r.IntN(maxPos))
			}
			rows := cs.toks * cs.rowsPerTok
			x := randF32(r, rows*cs.ld, 1)
			xp := a.up(x)
			chk(k.RoPE(s, xp, a.up(pos), a.up(cosT), a.up(sinT), rows, cs.rowsPerTok, cs.ld, cs.off, cs.rot, cs.interleaved))
			ref := refRoPE(x, pos, cosT, sinT, rows, cs.rowsPerTok, cs.ld, cs.off, cs.rot, cs.interleaved)
			record(t, cs.name, relMetric, relErr(downF32(c, xp, rows*cs.ld), ref), boundF32)
		}
		{
			n := 10007
			x, y := randF32(r, n, 1), randF32(r, n, 1)
			op := a.poisoned(n)
			chk(k.Add(s, op, a.up(x), a.up(y), n))
			ref := make([]float64, n)
			for i := range ref {
				ref[i] = float64(x[i]) + float64(y[i])
			}
			record(t, "add n=10007", relMetric, relErr(downF32(c, op, n), ref), 1e-6)
		}
		{
			rows, I := 3, 2048
			gu := randF32(r, rows*2*I, 2) // [rows][gate | up]
			op := a.poisoned(rows * I)
			gp := a.up(gu)
			chk(k.SiluMul(s, op, gp, gp.Add(int64(4*I)), rows, I, 2*I, 2*I, I))
			ref := make([]float64, rows*I)
			for rr := range rows {
				for i := range I {
					g, u := float64(gu[rr*2*I+i]), float64(gu[rr*2*I+I+i])
					ref[rr*I+i] = g * sigmoid(g) * u
				}
			}
			record(t, "silu_mul rows=3 I=2048", relMetric, relErr(downF32(c, op, rows*I), ref), boundF32)
		}
		// The row's 16-byte loads (D % 8 == 0: DeepSeek-V3.2's 7168, GLM-5's
		// 6144, a width past one round of loads) and the element loop (100,
		// and an output off the 16-byte grid).
		for _, vd := range []struct{ D, shift int }{{7168, 0}, {6144, 0}, {8200, 0}, {100, 0}, {7168, 1}} {
			form := map[bool]string{false: "", true: " (output off the 16-byte grid)"}[vd.shift != 0]
			D, V, T := vd.D, 1000, 5
			tab := randBF16(r, V*D, 1)
			ids := []int32{int32(r.IntN(V)), 0, int32(V - 1), int32(r.IntN(V)), int32(r.IntN(V))}
			op := a.poisoned(T*D + 1).Add(int64(4 * vd.shift))
			chk(k.EmbedBF16(s, op, a.up(tab), a.up(ids), T, D))
			ref := make([]float64, T*D)
			for tt, id := range ids {
				for i := range D {
					ref[tt*D+i] = bf16ToF64(tab[int(id)*D+i])
				}
			}
			record(t, fmt.Sprintf("embed_bf16 V=1000 D=%d T=5%s", D, form), relMetric, relErr(downF32(c, op, T*D), ref), 0)
			op = a.poisoned(T*D + 1).Add(int64(4 * vd.shift))
			chk(k.EmbedBF16Checked(s, op, a.up(tab), a.up(ids), T, D, V))
			record(t, fmt.Sprintf("embed_bf16_checked V=1000 D=%d T=5%s", D, form), relMetric, relErr(downF32(c, op, T*D), ref), 0)
			// Ids outside the table (arg-max over non-finite logits gives
			// 0x7fffffff) give NaN rows and read nothing outside it.
			bad := []int32{0x7fffffff, -1, int32(V), 3}
			op = a.poisoned(len(bad)*D + 1).Add(int64(4 * vd.shift))
			chk(k.EmbedBF16Checked(s, op, a.up(tab), a.up(bad), len(bad), D, V))
			got := downF32(c, op, len(bad)*D)
			nonNaN := 0
			for _, v := range got[:3*D] {
				if !math.IsNaN(float64(v)) {
					nonNaN++
				}
			}
			for i := range D {
				if float64(got[3*D+i]) != bf16ToF64(tab[3*D+i]) {
					nonNaN++
				}
			}
			record(t, fmt.Sprintf("embed_bf16_checked D=%d%s ids outside [0, V): non-NaN outputs (and wrong in-range row)", D, form), "count", float64(nonNaN), 0)
		}
		{
			kk, N := 8, 7168
			y, w, res := randF32(r, kk*N, 1), randF32(r, kk, 1), randF32(r, N, 1)
			op := a.poisoned(N)
			chk(k.MoECombine(s, op, a.up(y), a.up(w), a.up(res), kk, N))
			ref := make([]float64, N)
			for n := range N {
				ref[n] = float64(res[n])
				for j := range kk {
					ref[n] += float64(w[j]) * float64(y[j*N+n])
				}
			}
			record(t, "moe_combine k=8 N=7168", relMetric, relErr(downF32(c, op, N), ref), boundF32)
		}
	})
}

// ---- MoE gate ----

func TestKernelMoERoute(t *testing.T) {
	onGPU(t, func(c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand) {
		s := c.Stream()
		for _, cs := range []struct {
			name                 string
			T, E, K, ngroup, tkg int
			norm                 bool
			scale                float64
		}{
			{"moe_route DeepSeek E=256 K=8 groups 8/4", 6, 256, 8, 8, 4, true, 2.5},
			{"moe_route GLM-5 E=256 K=8 plain", 6, 256, 8, 1, 1, true, 2.5},
			{"moe_route E=64 K=6 groups 4/2 no-norm", 4, 64, 6, 4, 2, false, 1.0},
		} {
			logits := randF32(r, cs.T*cs.E, 2)
			bias := randF32(r, cs.E, 0.1)
			ip, wp := a.poisoned(cs.T*cs.K), a.poisoned(cs.T*cs.K)
			chk(k.MoERoute(s, ip, wp, a.up(logits), a.up(bias), cs.T, cs.E, cs.K, cs.ngroup, cs.tkg, cs.norm, float32(cs.scale)))
			checkRoutes(t, cs.name, cs.T, cs.E, cs.K, cs.ngroup, cs.tkg, cs.norm, cs.scale, bias,
				func(tt int) []float32 { return logits[tt*cs.E : (tt+1)*cs.E] },
				downI32(c, ip, cs.T*cs.K), downF32(c, wp, cs.T*cs.K))
		}
	})
}

// checkRoutes compares the experts gi and weights gw a kernel picked for
// rows rows against refMoERoute of each row's logits lg(row): a row whose
// picks differ at a float32 near-tie (gap < 1e-5) may legitimately flip
// and is not compared. It records the mismatched rows and the weights'
// relative error under name.
func checkRoutes(t *testing.T, name string, rows, E, K, ngroup, tkg int, norm bool, scale float64, bias []float32,
	lg func(row int) []float32, gi []int32, gw []float32) {
	t.Helper()
	mism, ties := 0, 0
	var wref []float64
	var wgot []float32
	for row := range rows {
		idx, w, gap := refMoERoute(lg(row), bias, E, K, ngroup, tkg, norm, scale)
		same := true
		for j := range K {
			if int(gi[row*K+j]) != idx[j] {
				same = false
			}
		}
		switch {
		case same:
			wref = append(wref, w...)
			wgot = append(wgot, gw[row*K:(row+1)*K]...)
		case gap < 1e-5:
			ties++
		default:
			mism++
			t.Logf("%s row %d: got %v want %v (gap %.3g)", name, row, gi[row*K:(row+1)*K], idx, gap)
		}
	}
	if ties > 0 {
		t.Logf("%s: %d near-tie rows not compared", name, ties)
	}
	record(t, name+" (experts)", "mismatched rows", float64(mism), 0)
	record(t, name+" (weights)", relMetric, relErr(wgot, wref), boundF32)
}

// ---- indexer ----

// randBlockTable maps nBlocks logical pages to distinct random pages of
// nPages (a paged cache's block table).
func randBlockTable(r *rand.Rand, nBlocks, nPages int) []int32 {
	bt := make([]int32, nBlocks)
	for i, p := range r.Perm(nPages)[:nBlocks] {
		bt[i] = int32(p)
	}
	return bt
}

// randIndexerKeys makes the indexer keys of T tokens: a cache of random
// pages, behind a random block table over 3 spare pages when paged (bt and
// its upload btp; nil and 0 otherwise).
func randIndexerKeys(r *rand.Rand, a *allocs, T int, paged bool) (cache []byte, bt []int32, btp cuda.DevPtr) {
	nBlocks := cdiv(T, IndexerPageTokens)
	nPages := nBlocks
	if paged {
		nPages += 3
		bt = randBlockTable(r, nBlocks, nPages)
		btp = a.up(bt)
	}
	return randIndexerCache(r, nPages), bt, btp
}

// fillIndexerCache makes a cache of nPages random pages (ue8m0-like scales).
func randIndexerCache(r *rand.Rand, nPages int) []byte {
	b := randFP8(r, nPages*IndexerPageBytes)
	for p := range nPages {
		for tok := range IndexerPageTokens {
			sc := float32(math.Ldexp(1, -4-r.IntN(5)))
			putF32(b[p*IndexerPageBytes+64*128+4*tok:], sc)
		}
	}
	return b
}

func putF32(b []byte, f float32) {
	u := math.Float32bits(f)
	b[0], b[1], b[2], b[3] = byte(u), byte(u>>8), byte(u>>16), byte(u>>24)
}

func getF32(b []byte) float32 {
	return math.Float32frombits(uint32(b[0]) | uint32(b[1])<<8 | uint32(b[2])<<16 | uint32(b[3])<<24)
}

func TestKernelIndexer(t *testing.T) {
	onGPU(t, func(c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand) {
		s := c.Stream()
		const H, D = 64, IndexerHeadDim
		nq, T := 2, 300
		lens := []int32{300, 250}
		nBlocks := cdiv(T, IndexerPageTokens)
		nPages := nBlocks + 3
		cache := randIndexerCache(r, nPages)
		bt := randBlockTable(r, nBlocks, nPages)
		q := randF32(r, nq*H*D, 1)
		w := randF32(r, nq*H, 1)
		const qkScale = 0.088
		ldOut := T + 5
		op := a.poisoned(nq * ldOut)
		chk(k.IndexerScores(s, op, a.up(q), a.up(w), a.up(cache), a.up(bt), a.up(lens), nq, H, T, ldOut, qkScale))
		got := downF32(c, op, nq*ldOut)
		opw := a.poisoned(nq * ldOut)
		chk(k.IndexerScoresWide(s, opw, a.up(q), a.up(w), a.up(cache), a.up(bt), a.up(lens), nq, H, T, ldOut, qkScale))
		gotW := downF32(c, opw, nq*ldOut)
		var gotV, gotWV []float32
		var ref []float64
		for qi := range nq {
			for tt := range T {
				gotV = append(gotV, got[qi*ldOut+tt])
				gotWV = append(gotWV, gotW[qi*ldOut+tt])
				if tt >= int(lens[qi]) {
					ref = append(ref, math.Inf(-1))
					continue
				}
				pg := cache[int(bt[tt/64])*IndexerPageBytes:]
				sc := float64(getF32(pg[64*128+4*(tt%64):]))
				var score float64
				for h := range H {
					var d float64
					for i := range D {
						d += float64(q[(qi*H+h)*D+i]) * fp8Table[pg[(tt%64)*128+i]] * sc
					}
					score += float64(w[qi*H+h]) * math.Max(0, qkScale*d)
				}
				ref = append(ref, score)
			}
		}
		record(t, "indexer_scores nq=2 H=64 T=300 paged", relMetric, relErr(gotV, ref), boundF32)
		record(t, "indexer_scores_wide nq=2 H=64 T=300 paged", relMetric, relErr(gotWV, ref), boundF32)
		if k.IndexerMMASupported() {
			checkIndexerMMA(t, c, k, a, r)
		}

		// Top-k: ties (values on a coarse grid), a short row, long rows.
		for _, cs := range []struct {
			name    string
			rows, T int
			K       int
			lens    []int32
			ties    bool
		}{
			{"topk T=5000 K=2048 ties, lens", 3, 5000, 2048, []int32{5000, 3000, 1000}, true},
			{"topk T=100000 K=2048", 2, 100000, 2048, nil, false},
			{"topk T=70 K=64", 1, 70, 64, nil, true},
			{"topk T=131072 K=2048 ties, lens", 3, 131072, 2048, []int32{131072, 70000, 2000}, true},
			{"topk T=131072 K=2048", 1, 131072, 2048, nil, false},
			// Every key in one 12-bit bin (the radix kernel's candidates are
			// the whole row), and every key equal.
			{"topk T=20000 K=2048 narrow, lens", 2, 20000, 2048, []int32{20000, 9000}, false},
			{"topk T=5000 K=2048 all equal", 1, 5000, 2048, nil, true},
			// 8 rows (slots x (1 + drafts)): ties, rows shorter than K,
			// a narrow row at long context.
			{"topk T=40000 K=2048 ties, 8 rows, lens", 8, 40000, 2048, []int32{40000, 2047, 2048, 2049, 39999, 100, 31000, 7}, true},
			{"topk T=131072 K=2048 narrow, 4 rows, lens", 4, 131072, 2048, []int32{131072, 1000, 131000, 65536}, false},
		} {
			x := make([]float32, cs.rows*cs.T)
			for i := range x {
				switch {
				case strings.Contains(cs.name, "narrow"):
					x[i] = 1 + float32(r.IntN(1<<12))/(1<<22)
				case strings.Contains(cs.name, "all equal"):
					x[i] = 0.25
				case cs.ties:
					x[i] = float32(r.IntN(64)) / 8
				default:
					x[i] = float32(r.NormFloat64())
				}
			}
			lp := cuda.DevPtr(0)
			if cs.lens != nil {
				lp = a.up(cs.lens)
			}
			xp := a.up(x)
			// TopKWide twice on one scratch: it must be left zeroed.
			scratch := a.up(make([]byte, TopKWideScratchBytes(cs.rows)))
			// TopKRadix likewise (its histogram must be left zeroed).
			rscratch := a.up(make([]byte, TopKRadixScratchBytes(cs.rows, cs.T)))
			for _, v := range []string{"", " (wide)", " (wide, scratch reused)", " (radix)", " (radix, scratch reused)", " (radix, bitmaps)", " (radix, global final)", " (radix, one block)", " (radix, one block, scratch reused)", " (radix, list w)", " (radix, list w, scratch reused)"} {
				op := a.poisoned(cs.rows * cs.K)
				switch {
				case v == "":
					chk(k.TopK(s, op, xp, lp, cs.rows, cs.T, cs.K, cs.T, cs.K))
				case strings.Contains(v, "list w"):
					lw0 := TopKListWLaunches.Load()
					chk(k.topkRadix(s, op, xp, lp, rscratch, cs.rows, cs.T, cs.K, cs.T, cs.K, TopKRadixListW))
					if TopKListWLaunches.Load() == lw0 {
						t.Errorf("%s%s: topk_radix_mark_lw did not run", cs.name, v)
					}
				case strings.Contains(v, "one block"):
					chk(k.topkRadix(s, op, xp, lp, rscratch, cs.rows, cs.T, cs.K, cs.T, cs.K, TopKRadixOne))
				case strings.Contains(v, "global final"):
					chk(k.topkRadix(s, op, xp, lp, rscratch, cs.rows, cs.T, cs.K, cs.T, cs.K, TopKRadixGlobal))
				case strings.Contains(v, "bitmaps"):
					chk(k.topkRadix(s, op, xp, lp, rscratch, cs.rows, cs.T, cs.K, cs.T, cs.K, TopKRadixBitmaps))
				case strings.Contains(v, "radix"):
					chk(k.TopKRadix(s, op, xp, lp, rscratch, cs.rows, cs.T, cs.K, cs.T, cs.K))
				default:
					chk(k.TopKWide(s, op, xp, lp, scratch, cs.rows, cs.T, cs.K, cs.T, cs.K))
				}
				got := downI32(c, op, cs.rows*cs.K)
				mism := 0
				for row := range cs.rows {
					n := cs.T
					if cs.lens != nil {
						n = int(cs.lens[row])
					}
					want := refTopK(x[row*cs.T:(row+1)*cs.T], n, cs.K)
					for j := range cs.K {
						if got[row*cs.K+j] != want[j] {
							mism++
						}
					}
				}
				record(t, cs.name+v, "mismatched indices", float64(mism), 0)
			}
		}
	})
}

// ---- MLA ----

func randMLACache(r *rand.Rand, nTok int) []byte {
	b := randFP8(r, nTok*MLATokenBytes)
	for tk := range nTok {
		row := b[tk*MLATokenBytes:]
		for g := range 4 {
			putF32(row[512+4*g:], float32(0.002+0.01*r.Float64()))
		}
		for i := range 64 {
			u := bf16Round(float32(r.NormFloat64()))
			row[528+2*i], row[529+2*i] = byte(u), byte(u>>8)
		}
	}
	return b
}

func TestKernelMLA(t *testing.T) {
	onGPU(t, func(c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand) {
		s := c.Stream()
		const nq, H = 2, 20 // H not a multiple of mla_decode_heads' 16-head groups
		lens := []int32{300, 270}
		nBlocks := cdiv(300, 64)
		nPages := nBlocks + 2
		cache := randMLACache(r, nPages*64)
		bt := randBlockTable(r, nBlocks, nPages)
		qn := randF32(r, nq*H*MLALatentDim, 1)
		qp := randF32(r, nq*H*MLARopeDim, 1)
		const scale = 0.35
		// Row 0: 200 distinct tokens then -1 padding; row 1: 256 tokens.
		const ldIdx, nidx = 260, 256
		idx := make([]int32, nq*ldIdx)
		for qi := range nq {
			perm := r.Perm(int(lens[qi]))
			for j := range nidx {
				idx[qi*ldIdx+j] = -1
				if j < len(perm) && (qi == 1 || j < 200) {
					idx[qi*ldIdx+j] = int32(perm[j])
				}
			}
		}
		latent := func(tk int) ([]float64, []float64) {
			pg := int(bt[tk/64])
			row := cache[(pg*64+tk%64)*MLATokenBytes:]
			cv := make([]float64, 512)
			for d := range 512 {
				cv[d] = fp8Table[row[d]] * float64(getF32(row[512+4*(d/128):]))
			}
			rv := make([]float64, 64)
			for i := range 64 {
				rv[i] = bf16ToF64(uint16(row[528+2*i]) | uint16(row[529+2*i])<<8)
			}
			return cv, rv
		}
		ref := func(qi, h int, toks []int) ([]float64, float64, float64) {
			o := make([]float64, 512)
			var maxC float64
			sc := make([]float64, len(toks))
			mx := math.Inf(-1)
			for j, tk := range toks {
				cv, rv := latent(tk)
				var d float64
				for i := range 512 {
					d += float64(qn[(qi*H+h)*512+i]) * cv[i]
					maxC = math.Max(maxC, math.Abs(cv[i]))
				}
				for i := range 64 {
					d += float64(qp[(qi*H+h)*64+i]) * rv[i]
				}
				sc[j] = d * scale
				mx = math.Max(mx, sc[j])
			}
			var l float64
			for j, tk := range toks {
				p := math.Exp(sc[j] - mx)
				l += p
				cv, _ := latent(tk)
				for i := range 512 {
					o[i] += p * cv[i]
				}
			}
			for i := range o {
				o[i] /= l
			}
			return o, mx + math.Log(l), maxC
		}
		// Kernels: 0 mla_decode, 1 mla_decode_heads, 2 mla_decode_tc (fp16
		// queries and probabilities on tensor cores: boundTC, as all from
		// here), 3 tcp, 4 tcf, 5 tcf8, 6 tcf2.
		for _, cs := range []struct {
			sparse bool
			kern   int
			nsplit int
		}{{true, 0, 1}, {false, 0, 1}, {true, 0, 3}, {false, 0, 5},
			{true, 1, 1}, {false, 1, 1}, {true, 1, 3}, {false, 1, 5}, {true, 1, 8},
			{true, 2, 1}, {false, 2, 1}, {true, 2, 3}, {false, 2, 5}, {true, 2, 8},
			{true, 3, 1}, {false, 3, 1}, {true, 3, 3}, {false, 3, 5}, {true, 3, 8},
			{true, 4, 1}, {false, 4, 1}, {true, 4, 3}, {false, 4, 5}, {true, 4, 8},
			{true, 5, 1}, {false, 5, 1}, {true, 5, 3}, {false, 5, 5},
			{true, 6, 1}, {false, 6, 1}, {true, 6, 3}, {false, 6, 5}, {true, 6, 8}} {
			if cs.kern >= 4 && c.Info().CCMajor < 9 {
				continue // mla_decode_tcf*: sm_90
			}
			sparse := cs.sparse
			op, lp := a.poisoned(nq*H*512), a.poisoned(nq*H)
			ip := cuda.DevPtr(0)
			n := 300 // dense: bound on lens
			if sparse {
				ip, n = a.up(idx), nidx
			}
			ws := cuda.DevPtr(0)
			if cs.nsplit > 1 {
				ws = a.poisoned(int(MLAWorkspaceBytes(nq, H, cs.nsplit) / 4))
			}
			switch cs.kern {
			case 1:
				chk(k.MLADecodeHeads(s, op, lp, a.up(qn), a.up(qp), a.up(cache), a.up(bt), ip, a.up(lens), ws, nq, H, n, ldIdx, cs.nsplit, scale))
			case 2:
				chk(k.MLADecodeTC(s, op, lp, a.up(qn), a.up(qp), a.up(cache), a.up(bt), ip, a.up(lens), ws, nq, H, n, ldIdx, cs.nsplit, scale))
			case 3:
				chk(k.MLADecodeTCP(s, op, lp, a.up(qn), a.up(qp), a.up(cache), a.up(bt), ip, a.up(lens), ws, nq, H, n, ldIdx, cs.nsplit, scale))
			case 4:
				chk(k.MLADecodeTCF(s, MLATCF3, op, lp, a.up(qn), a.up(qp), a.up(cache), a.up(bt), 0, ip, a.up(lens), ws, nq, H, n, ldIdx, cs.nsplit, scale))
			case 5, 6:
				v := []MLATCF{MLATCF8, MLATCF2}[cs.kern-5]
				chk(k.MLADecodeTCF(s, v, op, lp, a.up(qn), a.up(qp), a.up(cache), a.up(bt), 0, ip, a.up(lens), ws, nq, H, n, ldIdx, cs.nsplit, scale))
			default:
				chk(k.MLADecode(s, op, lp, a.up(qn), a.up(qp), a.up(cache), a.up(bt), ip, a.up(lens), ws, nq, H, n, ldIdx, cs.nsplit, scale))
			}
			got, gotL := downF32(c, op, nq*H*512), downF32(c, lp, nq*H)
			var worst, worstL float64
			for qi := range nq {
				var toks []int
				for j := range nidx {
					if sparse {
						if v := idx[qi*ldIdx+j]; v >= 0 {
							toks = append(toks, int(v))
						}
					}
				}
				if !sparse {
					for tk := range int(lens[qi]) {
						toks = append(toks, tk)
					}
				}
				for h := range H {
					o, lse, maxC := ref(qi, h, toks)
					for i := range 512 {
						g := float64(got[(qi*H+h)*512+i])
						if math.IsNaN(g) {
							worst = math.Inf(1)
						}
						worst = math.Max(worst, math.Abs(g-o[i])/maxC)
					}
					gl := float64(gotL[qi*H+h])
					if math.IsNaN(gl) {
						worstL = math.Inf(1)
					}
					worstL = math.Max(worstL, math.Abs(gl-lse)/math.Max(1, math.Abs(lse)))
				}
			}
			kname, bound := []string{"mla_decode", "mla_decode_heads", "mla_decode_tc", "mla_decode_tcp", "mla_decode_tcf", "mla_decode_tcf8", "mla_decode_tcf2"}[cs.kern], boundF32
			if cs.kern >= 2 {
				bound = boundTC
			}
			name := fmt.Sprintf("%s dense nq=2 H=20 len=300/270 paged split=%d", kname, cs.nsplit)
			if sparse {
				name = fmt.Sprintf("%s top-k idx nq=2 H=20 paged split=%d", kname, cs.nsplit)
			}
			record(t, name, "max|d|/max|c|", worst, bound)
			record(t, name+" (lse)", "|d|/max(1,|lse|)", worstL, bound)
		}
	})
}

// ---- sampling ----

func TestKernelSampling(t *testing.T) {
	onGPU(t, func(c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand) {
		s := c.Stream()
		const V = 129280
		{
			rows := 3
			x := randF32(r, rows*V, 3)
			x[V+500] = 50 // a tie in row 1: the lower index wins
			x[V+9000] = 50
			op, vp := a.poisoned(rows), a.poisoned(rows)
			chk(k.Argmax(s, op, vp, a.up(x), rows, V, V))
			got := downI32(c, op, rows)
			mism := 0
			for row := range rows {
				best := 0
				for i := range V {
					if x[row*V+i] > x[row*V+best] {
						best = i
					}
				}
				if int(got[row]) != best {
					mism++
				}
			}
			record(t, "argmax V=129280 (ties)", "mismatched rows", float64(mism), 0)
		}
		// The many-block arg-max: ties across block boundaries, NaNs (never
		// chosen), an all -inf row, an all-NaN row (no index: 0x7fffffff), odd
		// sizes; twice on one scratch (the counters must come back zeroed).
		for _, n := range []int{129280, 4097, 5} {
			rows := 5
			x := randF32(r, rows*n, 3)
			x[min(n-1, 2048)] = 60 // row 0: a tie between blocks, the lower index wins
			x[n-1] = 60
			x[n+n/3] = float32(math.NaN())
			x[n+n/2] = 70
			for i := range n {
				x[2*n+i] = float32(math.Inf(-1))
				x[3*n+i] = float32(math.NaN())
			}
			xp := a.up(x)
			sc := a.raw(ArgmaxScratchBytes(rows))
			chk(c.MemsetD8(sc, 0, ArgmaxScratchBytes(rows), s))
			mism := 0
			for rep := range 2 {
				op, vp := a.poisoned(rows), a.poisoned(rows)
				chk(k.ArgmaxWide(s, op, vp, xp, sc, rows, n, n))
				got, gv := downI32(c, op, rows), downF32(c, vp, rows)
				for row := range rows {
					best, bv := int32(0x7fffffff), float32(math.Inf(-1))
					for i := range n {
						v := x[row*n+i]
						if v > bv || (v == bv && int32(i) < best) {
							best, bv = int32(i), v
						}
					}
					if got[row] != best || math.Float32bits(gv[row]) != math.Float32bits(bv) {
						mism++
						t.Logf("n=%d rep=%d row %d: got %d (%v), want %d (%v)", n, rep, row, got[row], gv[row], best, bv)
					}
				}
			}
			record(t, fmt.Sprintf("argmax wide n=%d (ties, NaN, -inf), x2 on one scratch", n), "mismatched rows", float64(mism), 0)
		}
		// The one-block sampler and the many-block one (SampleWide, on one
		// scratch for every launch: each must leave it zeroed), in chunks
		// of at most wideRows rows, each chunk's counters from its first
		// row on, which is one launch of all the rows.
		const wideRows = 4000
		wsc := a.raw(SampleScratchBytes(wideRows))
		chk(c.MemsetD8(wsc, 0, SampleScratchBytes(wideRows), s))
		samplers := []struct {
			name string
			draw func(out, x cuda.DevPtr, rows, n int, p SamplingParams) error
		}{
			{"sample", func(out, x cuda.DevPtr, rows, n int, p SamplingParams) error {
				return k.Sample(s, out, x, rows, n, n, p)
			}},
			{"sample wide", func(out, x cuda.DevPtr, rows, n int, p SamplingParams) error {
				for r0 := 0; r0 < rows; r0 += wideRows {
					q := p
					q.Step += uint64(r0)
					if err := k.SampleWide(s, out.Add(int64(4*r0)), x.Add(int64(4*r0*n)), wsc, min(wideRows, rows-r0), n, n, q); err != nil {
						return err
					}
				}
				return nil
			}},
		}
		// The two agree token for token on full-size rows (the same survivors
		// and the same draw function; top-p's fixed point differs only where
		// two masses tie within 2^-40), and on a row of -inf and a 5-wide one.
		for _, cs := range []SamplingParams{{Temperature: 0}, {Temperature: 0.6, TopP: 0.95}, {Temperature: 1, TopP: 1},
			{Temperature: 0.7, TopK: 50, TopP: 0.9}, {Temperature: 1, TopP: 1, MinP: 0.05}, {Temperature: 0.8, TopK: 1, TopP: 1},
			{Temperature: 1.3, TopK: 4000, TopP: 0.5, MinP: 0.001}} {
			for _, n := range []int{129280, 4097, 5} {
				const rows = 6
				cs.Seed, cs.Step = r.Uint64(), r.Uint64N(1<<40)
				x := randF32(r, rows*n, 2+4*r.Float64())
				for i := range n {
					x[5*n+i] = float32(math.Inf(-1))
				}
				xp := a.up(x)
				var got [2][]int32
				for j, sm := range samplers {
					op := a.poisoned(rows)
					chk(sm.draw(op, xp, rows, n, cs))
					got[j] = downI32(c, op, rows)
				}
				mism := 0
				for row := range rows {
					if got[0][row] != got[1][row] {
						mism++
						t.Logf("n=%d row %d %+v: sample %d, sample wide %d", n, row, cs, got[0][row], got[1][row])
					}
				}
				record(t, fmt.Sprintf("sample wide == sample T=%.1f k=%d p=%.2f min-p=%.3f n=%d", cs.Temperature, cs.TopK, cs.TopP, cs.MinP, n), "mismatched rows", float64(mism), 0)
			}
		}
		for _, sm := range samplers {
			// Seeded draws vs the float64 reference of the same Gumbel-max rule.
			for _, cs := range []struct {
				name string
				p    SamplingParams
			}{
				{"sample greedy (T=0)", SamplingParams{Temperature: 0}},
				{"sample T=0.8 top-k=50", SamplingParams{Temperature: 0.8, TopK: 50, TopP: 1}},
				{"sample T=1 top-p=0.9", SamplingParams{Temperature: 1, TopP: 0.9}},
				{"sample T=0.7 top-k=200 top-p=0.8", SamplingParams{Temperature: 0.7, TopK: 200, TopP: 0.8}},
				{"sample T=1 min-p=0.1", SamplingParams{Temperature: 1, TopP: 1, MinP: 0.1}},
				{"sample T=0.8 top-k=300 min-p=0.05 top-p=0.9", SamplingParams{Temperature: 0.8, TopK: 300, TopP: 0.9, MinP: 0.05}},
			} {
				const rows, n = 8, 32000
				cs.p.Seed, cs.p.Step = r.Uint64(), r.Uint64N(1<<40)
				x := randF32(r, rows*n, 2)
				op := a.poisoned(rows)
				chk(sm.draw(op, a.up(x), rows, n, cs.p))
				got := downI32(c, op, rows)
				mism := 0
				for row := range rows {
					xr := x[row*n : (row+1)*n]
					want, gap := 0, math.Inf(1)
					if cs.p.Temperature <= 0 {
						for i := range xr {
							if xr[i] > xr[want] {
								want = i
							}
						}
					} else {
						p := refSampleSet(xr, float64(cs.p.Temperature), cs.p.TopK, float64(cs.p.TopP), float64(cs.p.MinP))
						best, second := math.Inf(-1), math.Inf(-1)
						for i := range xr {
							if p[i] == 0 {
								continue
							}
							g := float64(xr[i])/float64(cs.p.Temperature) - math.Log(-math.Log(rngUniform(cs.p.Seed, cs.p.Step+uint64(row), uint64(i))))
							if g > best {
								second, best, want = best, g, i
							} else if g > second {
								second = g
							}
						}
						gap = best - second
					}
					if int(got[row]) != want {
						if gap < 1e-4 {
							t.Logf("%s row %d: near tie (gap %.3g), got %d want %d", cs.name, row, gap, got[row], want)
							continue
						}
						mism++
					}
				}
				record(t, sm.name+strings.TrimPrefix(cs.name, "sample"), "mismatched rows", float64(mism), 0)
			}
			// Distribution: many draws of one small row against its probabilities.
			for _, cs := range []SamplingParams{{Temperature: 1, TopP: 1}, {Temperature: 0.9, TopK: 5, TopP: 1}, {Temperature: 1.2, TopP: 0.7},
				{Temperature: 1, TopP: 1, MinP: 0.2}, {Temperature: 1.5, TopP: 0.8, MinP: 0.1}} {
				const n, rows = 16, 40000
				row := randF32(r, n, 1)
				x := make([]float32, 0, rows*n)
				for range rows {
					x = append(x, row...)
				}
				cs.Seed, cs.Step = r.Uint64(), 0
				op := a.poisoned(rows)
				chk(sm.draw(op, a.up(x), rows, n, cs))
				got := downI32(c, op, rows)
				p := refSampleSet(row, float64(cs.Temperature), cs.TopK, float64(cs.TopP), float64(cs.MinP))
				cnt := make([]float64, n)
				bad := false
				for _, g := range got {
					if g < 0 || int(g) >= n {
						bad = true
						continue
					}
					cnt[g]++
				}
				z := 0.0
				for i := range n {
					f := cnt[i] / rows
					if p[i] == 0 {
						if cnt[i] > 0 {
							z = math.Inf(1)
						}
						continue
					}
					z = math.Max(z, math.Abs(f-p[i])/math.Sqrt(p[i]*(1-p[i])/rows+1e-300))
				}
				if bad {
					z = math.Inf(1)
				}
				record(t, fmt.Sprintf("%s distribution T=%.1f k=%d p=%.1f min-p=%.1f (40000 draws)", sm.name, cs.Temperature, cs.TopK, cs.TopP, cs.MinP), "max z-score", z, 5)
			}
		}
		// After all that, each row's counter and histogram are zeroed again
		// (the state and the partials are written before they are read).
		left := make([]byte, SampleScratchBytes(wideRows))
		chk(c.Download(left, wsc))
		nz := 0
		for row := range wideRows {
			b := left[row*sampleWideRowBytes:]
			for i := range 8 + 64 + 2048*8 {
				if (i < 4 || i >= 72) && b[i] != 0 {
					nz++
				}
			}
		}
		record(t, "sample wide scratch left zeroed (counters, histograms)", "non-zero bytes", float64(nz), 0)
	})
}

// ---- cache writes ----

func refUE8M0(amax float32) float32 {
	if !(amax > 0) {
		return 1
	}
	fr, e := math.Frexp(float64(amax) / 448)
	if fr == 0.5 {
		e--
	}
	e = max(min(e, 127), -126)
	return float32(math.Ldexp(1, e))
}

func diffBytes(a, b []byte) int {
	n := 0
	for i := range a {
		if a[i] != b[i] {
			n++
		}
	}
	return n
}

// ---- graphs ----

func TestGraphReplay(t *testing.T) {
	onGPU(t, func(c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand) {
		s, err := c.NewStream()
		chk(err)
		defer c.DestroyStream(s)
		const D, N = 1024, 512
		xp, wn, wp := a.raw(4*D), a.raw(4*D), a.raw(2*N*D)
		hp, yp := a.raw(4*D), a.poisoned(N)
		// Capture rmsnorm -> bf16 GEMV (+ residual into y) once.
		chk(c.BeginCapture(s))
		chk(k.RMSNorm(s, hp, xp, wn, 1, D, D, D, 1e-6))
		chk(k.GemvBF16(s, yp, hp, wp, yp, N, D, 1, D, N))
		g, err := c.EndCapture(s)
		chk(err)
		defer c.DestroyGraph(g)
		worst := 0.0
		for range 3 { // fresh inputs in the same buffers each replay
			x, w := randF32(r, D, 1), randF32(r, D, 1)
			W := randBF16(r, N*D, 0.05)
			y0 := randF32(r, N, 1)
			chk(c.Upload(xp, x))
			chk(c.Upload(wn, w))
			chk(c.Upload(wp, W))
			chk(c.Upload(yp, y0))
			chk(c.LaunchGraph(g, s))
			chk(c.SyncStream(s))
			h := refRMSNorm(x, w, 1, D, 1e-6)
			hf := make([]float32, D)
			for i := range h {
				hf[i] = float32(h[i])
			}
			ref := refGemv(func(n, kk int) float64 { return bf16ToF64(W[n*D+kk]) }, hf, y0, N, D, 1, D, N)
			worst = math.Max(worst, relErr(downF32(c, yp, N), ref))
		}
		record(t, "graph replay rmsnorm+gemv_bf16 x3", relMetric, worst, boundF32)
	})
}

func writeReport() error {
	reportMu.Lock()
	defer reportMu.Unlock()
	if len(reportRows) == 0 && len(timingRows) == 0 {
		return nil
	}
	var b strings.Builder
	tw := tabwriter.NewWriter(&b, 2, 4, 2, ' ', 0)
	if len(reportRows) > 0 {
		fmt.Fprintln(tw, "check\tmetric\tmax error\tbound\tresult")
		for _, r := range reportRows {
			res := "PASS"
			if !r.Pass {
				res = "FAIL"
			}
			fmt.Fprintf(tw, "%s\t%s\t%.3g\t%.3g\t%s\n", r.Name, r.Metric, r.Err, r.Bound, res)
		}
	}
	if len(timingRows) > 0 {
		fmt.Fprintln(tw, "\t\t\t\t")
		fmt.Fprintln(tw, "kernel timing\tbytes\tmedian us\tGB/s\tof copy BW")
		sort.SliceStable(timingRows, func(i, j int) bool { return false })
		for _, r := range timingRows {
			fmt.Fprintf(tw, "%s\t%.3g\t%.2f\t%.0f\t%.0f%% %s\n", r.Name, r.Bytes, r.Median, r.GBps, 100*r.OfCopy, r.Comment)
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Print("\n" + b.String())
	if p := os.Getenv("TILERT_GPU_REPORT"); p != "" {
		return os.WriteFile(p, []byte(b.String()), 0o644)
	}
	return nil
}
