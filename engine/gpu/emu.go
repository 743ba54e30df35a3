package gpu

import (
	"encoding/binary"
	"math"
	"slices"
	"sort"
	"unsafe"

	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/cuda"
	"github.com/tilert-go/tilert/cuda/kernels"
	"github.com/tilert-go/tilert/engine"
	"github.com/tilert-go/tilert/engine/internal/kern"
	"github.com/tilert-go/tilert/numeric"
)

// emuDevice transcribes every kernel the engine launches into Go over
// host memory addressed by fake device pointers. Each op has the contract of
// its CUDA launcher; the arithmetic reuses the CPU engine's building blocks
// (kern.Dot, kern.RMSNorm, engine.EncodeMLAFP8, ...), so the emulated engine
// tracks the CPU engine closely and a wrong stride, offset or buffer size in
// the orchestration shows up (out-of-range accesses panic) without a GPU.
type emuDevice struct {
	allocs []emuAlloc // sorted by base
	next   uint64
}

type emuAlloc struct {
	base uint64
	buf  []byte
}

var _ device = (*emuDevice)(nil)

func newEmu() *emuDevice { return &emuDevice{next: 1 << 40} }

func (m *emuDevice) alloc(n int64) (cuda.DevPtr, error) {
	if n <= 0 {
		n = 1
	}
	a := emuAlloc{base: m.next, buf: make([]byte, n)}
	m.next += (uint64(n) + 4095) &^ 255
	m.allocs = append(m.allocs, a)
	return cuda.DevPtr(a.base), nil
}

func (m *emuDevice) hostAlloc(n int) ([]byte, func() error, error) {
	return make([]byte, n), func() error { return nil }, nil
}

func (m *emuDevice) free(p cuda.DevPtr) error {
	for i, a := range m.allocs {
		if a.base == uint64(p) {
			m.allocs = slices.Delete(m.allocs, i, i+1)
			return nil
		}
	}
	return errors.Newf("emu: free of %#x, not an allocation", uint64(p))
}

// mem returns n bytes at p; an access outside one allocation panics (the
// runner turns it into an error naming the address).
func (m *emuDevice) mem(p cuda.DevPtr, n int) []byte {
	i := sort.Search(len(m.allocs), func(i int) bool { return m.allocs[i].base > uint64(p) }) - 1
	if i < 0 || n < 0 {
		panic(errors.Newf("emu: access of %d bytes at %#x: no allocation", n, uint64(p)))
	}
	a := m.allocs[i]
	off := uint64(p) - a.base
	if off+uint64(n) > uint64(len(a.buf)) {
		panic(errors.Newf("emu: access of %d bytes at %#x overruns its %d-byte allocation at offset %d", n, uint64(p), len(a.buf), off))
	}
	return a.buf[off : off+uint64(n)]
}

func (m *emuDevice) f32(p cuda.DevPtr, n int) []float32 {
	if n == 0 {
		return nil
	}
	b := m.mem(p, 4*n)
	return unsafe.Slice((*float32)(unsafe.Pointer(&b[0])), n)
}

func (m *emuDevice) i32(p cuda.DevPtr, n int) []int32 {
	if n == 0 {
		return nil
	}
	b := m.mem(p, 4*n)
	return unsafe.Slice((*int32)(unsafe.Pointer(&b[0])), n)
}

func (m *emuDevice) u16(p cuda.DevPtr, n int) []uint16 {
	if n == 0 {
		return nil
	}
	b := m.mem(p, 2*n)
	return unsafe.Slice((*uint16)(unsafe.Pointer(&b[0])), n)
}

func (m *emuDevice) ptrs(p cuda.DevPtr, n int) []cuda.DevPtr {
	b := m.mem(p, 8*n)
	return unsafe.Slice((*cuda.DevPtr)(unsafe.Pointer(&b[0])), n)
}

func (m *emuDevice) upload(dst cuda.DevPtr, src []byte) error {
	copy(m.mem(dst, len(src)), src)
	return nil
}

func (m *emuDevice) download(dst []byte, src cuda.DevPtr) error {
	copy(dst, m.mem(src, len(dst)))
	return nil
}

// downloadAsync copies at once: the emulator runs every call as it comes.
func (m *emuDevice) downloadAsync(dst []byte, src cuda.DevPtr) (func() error, error) {
	return func() error { return nil }, m.download(dst, src)
}

func (m *emuDevice) launchQueued() error { return nil }

// uploadBeside copies at once, as upload does.
func (m *emuDevice) uploadBeside(dst cuda.DevPtr, src []byte) error { return m.upload(dst, src) }

func (m *emuDevice) copyDD(dst, src cuda.DevPtr, n int64) error {
	if n == 0 {
		return nil
	}
	copy(m.mem(dst, int(n)), m.mem(src, int(n)))
	return nil
}

func (m *emuDevice) zero(dst cuda.DevPtr, n int64) error {
	clear(m.mem(dst, int(n)))
	return nil
}

func (m *emuDevice) sync() error { return nil }

// gemv dequantises each weight row (as the CPU engine holds it) and takes
// kern.Dot with every input row.
func (m *emuDevice) gemv(y, x cuda.DevPtr, N, K, M, ldx, ldy int, row func(n int, dst []float32)) error {
	if N <= 0 || K <= 0 || M <= 0 || M > kernels.MaxTileM || ldx < K || (M > 1 && ldy < N) {
		return errors.Newf("emu gemv: N=%d K=%d M=%d ldx=%d ldy=%d", N, K, M, ldx, ldy)
	}
	xs := m.f32(x, (M-1)*ldx+K)
	ys := m.f32(y, (M-1)*ldy+N)
	w := make([]float32, K)
	for n := 0; n < N; n++ {
		row(n, w)
		for r := 0; r < M; r++ {
			ys[r*ldy+n] = kern.Dot(xs[r*ldx:r*ldx+K], w)
		}
	}
	return nil
}

func fp8Row(dst []float32, w []byte, s []float32) {
	for k := range dst {
		dst[k] = numeric.FP8E4M3ToFloat32(w[k]) * s[k/numeric.FP8BlockSize]
	}
}

func (m *emuDevice) gemvFP8(y, x, w, scale cuda.DevPtr, N, K, M, ldx, ldy int) error {
	kb := (K + 127) / 128
	wb := m.mem(w, N*K)
	sb := m.f32(scale, ((N+127)/128)*kb)
	return m.gemv(y, x, N, K, M, ldx, ldy, func(n int, dst []float32) {
		fp8Row(dst, wb[n*K:(n+1)*K], sb[(n/128)*kb:(n/128+1)*kb])
	})
}

func (m *emuDevice) gemvBF16(y, x, w cuda.DevPtr, N, K, M, ldx, ldy int) error {
	wb := m.u16(w, N*K)
	return m.gemv(y, x, N, K, M, ldx, ldy, func(n int, dst []float32) {
		for k := range dst {
			dst[k] = numeric.BF16ToFloat32(wb[n*K+k])
		}
	})
}

func (m *emuDevice) gemvF32(y, x, w cuda.DevPtr, N, K, M, ldx, ldy int) error {
	wb := m.f32(w, N*K)
	return m.gemv(y, x, N, K, M, ldx, ldy, func(n int, dst []float32) { copy(dst, wb[n*K:(n+1)*K]) })
}

func (m *emuDevice) gemvExperts(y, x cuda.DevPtr, xstride int, wTable, sTable, ids cuda.DevPtr, slots, N, K int) error {
	id := m.i32(ids, slots)
	for j := 0; j < slots; j++ {
		e := int(id[j])
		wt := m.ptrs(wTable, e+1)
		st := m.ptrs(sTable, e+1)
		xj := x.Add(int64(4 * j * xstride))
		if err := m.gemvFP8(y.Add(int64(4*j*N)), xj, wt[e], st[e], N, K, 1, K, N); err != nil {
			return err
		}
	}
	return nil
}

// gemvGroup is rmsnorm (into scratch, with norm) then each segment's GEMV,
// with kernels.GemvGroup's checks.
func (m *emuDevice) gemvGroup(x cuda.DevPtr, K, M, ldx int, segs []kernels.GroupSeg, norm kernels.GroupNorm) error {
	if K <= 0 || M <= 0 || M > kernels.MaxTileM || ldx < K || len(segs) == 0 || len(segs) > kernels.MaxGroupSegs {
		return errors.Newf("emu gemv group: K=%d M=%d ldx=%d, %d segments", K, M, ldx, len(segs))
	}
	if ldx%4 != 0 || uint64(x)%16 != 0 {
		return errors.Newf("emu gemv group: ldx=%d x=%#x: needs ldx %% 4 == 0 and aligned x", ldx, uint64(x))
	}
	if len(segs) > 0 && (segs[0].OutW != 0 || segs[0].SumSq != 0) {
		defer m.qaGroupOut(segs[0], M)
	}
	if norm.W != 0 {
		xn, err := m.alloc(int64(4 * M * K))
		if err != nil {
			return err
		}
		defer m.free(xn)
		if err := m.rmsnorm(xn, x, norm.W, M, K, ldx, K, norm.Eps); err != nil {
			return err
		}
		x, ldx = xn, K
	}
	for i, sg := range segs {
		if sg.N <= 0 || (M > 1 && sg.LdY < sg.N) || uint64(sg.W)%16 != 0 {
			return errors.Newf("emu gemv group: segment %d: N=%d LdY=%d W=%#x", i, sg.N, sg.LdY, uint64(sg.W))
		}
		var err error
		if sg.BF16 {
			if K%8 != 0 {
				return errors.Newf("emu gemv group: bf16 K=%d: needs K %% 8 == 0", K)
			}
			err = m.gemvBF16(sg.Y, x, sg.W, sg.N, K, M, ldx, sg.LdY)
		} else {
			if K%16 != 0 || sg.S == 0 {
				return errors.Newf("emu gemv group: fp8 K=%d S=%#x: needs K %% 16 == 0 and scales", K, uint64(sg.S))
			}
			err = m.gemvFP8(sg.Y, x, sg.W, sg.S, sg.N, K, M, ldx, sg.LdY)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// gateUp is the two GEMVs then SwiGLU, as kernels.GateUpFP8.
func (m *emuDevice) gateUp(y, x, wg, sg, wu, su cuda.DevPtr, N, K, M, ldx, ldy int) error {
	if K%16 != 0 || ldx%4 != 0 || uint64(x)%16 != 0 {
		return errors.Newf("emu gate-up: K=%d ldx=%d x=%#x: needs K %% 16 == 0, ldx %% 4 == 0 and aligned x", K, ldx, uint64(x))
	}
	gp, _ := m.alloc(int64(4 * M * N))
	up, _ := m.alloc(int64(4 * M * N))
	defer m.free(gp)
	defer m.free(up)
	if err := m.gemvFP8(gp, x, wg, sg, N, K, M, ldx, N); err != nil {
		return err
	}
	if err := m.gemvFP8(up, x, wu, su, N, K, M, ldx, N); err != nil {
		return err
	}
	return m.siluMul(y, gp, up, M, N, N, N, ldy)
}

// expertsShaped is experts: the emulator's slots do not depend on the
// launch's shape.
func (m *emuDevice) expertsShaped(y, x cuda.DevPtr, ldx, xdiv, xsh int, t, ts [2]cuda.DevPtr, ids cuda.DevPtr, slots int, w, ws [2]cuda.DevPtr, dense, N, K, _ int) error {
	return m.experts(y, x, ldx, xdiv, xsh, t, ts, ids, slots, w, ws, dense, N, K)
}

// experts is kernels.ExpertsFP8 slot by slot.
func (m *emuDevice) experts(y, x cuda.DevPtr, ldx, xdiv, xsh int, t, ts [2]cuda.DevPtr, ids cuda.DevPtr, slots int, w, ws [2]cuda.DevPtr, dense, N, K int) error {
	if N <= 0 || K <= 0 || slots < 0 || dense < 0 || xdiv <= 0 || ldx < K {
		return errors.Newf("emu experts: N=%d K=%d slots=%d dense=%d xdiv=%d ldx=%d", N, K, slots, dense, xdiv, ldx)
	}
	if K%16 != 0 || ldx%4 != 0 || uint64(x)%16 != 0 {
		return errors.Newf("emu experts: K=%d ldx=%d x=%#x: needs K %% 16 == 0, ldx %% 4 == 0 and aligned x", K, ldx, uint64(x))
	}
	var id []int32
	if slots > 0 {
		id = m.i32(ids, slots)
	}
	for j := 0; j < slots+dense; j++ {
		var err error
		if j < slots {
			err = m.routedSlot(y, x, ldx, xdiv, t, ts, int(id[j]), j, N, K)
		} else {
			err = m.slotGemv(fptr(y, j*N), fptr(x, (xsh+j-slots)*ldx), [2]cuda.DevPtr{w[0], w[1]}, [2]cuda.DevPtr{ws[0], ws[1]}, N, K, ldx)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// routedSlot runs routed slot j on expert e: row j / xdiv of x into row j
// of y (ExpertsFP8's layout).
func (m *emuDevice) routedSlot(y, x cuda.DevPtr, ldx, xdiv int, t, ts [2]cuda.DevPtr, e, j, N, K int) error {
	var w, s [2]cuda.DevPtr
	w[0], s[0] = m.ptrs(t[0], e+1)[e], m.ptrs(ts[0], e+1)[e]
	if t[1] != 0 {
		w[1], s[1] = m.ptrs(t[1], e+1)[e], m.ptrs(ts[1], e+1)[e]
	}
	return m.slotGemv(fptr(y, j*N), fptr(x, (j/xdiv)*ldx), w, s, N, K, ldx)
}

// slotGemv is one slot's projection: gate/up with SwiGLU when w[1] is set.
func (m *emuDevice) slotGemv(y, x cuda.DevPtr, w, s [2]cuda.DevPtr, N, K, ldx int) error {
	if w[1] != 0 {
		return m.gateUp(y, x, w[0], s[0], w[1], s[1], N, K, 1, ldx, N)
	}
	return m.gemvFP8(y, x, w[0], s[0], N, K, 1, ldx, N)
}

func (m *emuDevice) moeCombineSlots(out, y, w, resid cuda.DevPtr, M, k, N int) error {
	for r := 0; r < M; r++ {
		rr := cuda.DevPtr(0)
		if resid != 0 {
			rr = fptr(resid, r*N)
		}
		if err := m.moeCombine(fptr(out, r*N), fptr(y, r*k*N), fptr(w, r*k), rr, k, N); err != nil {
			return err
		}
	}
	return nil
}

// moeCombineNorm is the two operations it fuses.
func (m *emuDevice) moeCombineNorm(ny, x, out, y, w, resid, nw cuda.DevPtr, M, k, N int, eps float32) error {
	if err := m.moeCombineSlots(out, y, w, resid, M, k, N); err != nil {
		return err
	}
	return m.addRMSNorm(ny, x, out, nw, M, N, N, N, N, eps)
}

func (m *emuDevice) rmsnorm(y, x, w cuda.DevPtr, rows, D, ldx, ldy int, eps float32) error {
	ws := m.f32(w, D)
	for r := 0; r < rows; r++ {
		xs := m.f32(x.Add(int64(4*r*ldx)), D)
		ys := m.f32(y.Add(int64(4*r*ldy)), D)
		kern.RMSNorm(ys, xs, ws, float64(eps))
	}
	return nil
}

func (m *emuDevice) layernorm(y, x, w, b cuda.DevPtr, rows, D, ldx, ldy int, eps float32) error {
	ws, bs := m.f32(w, D), m.f32(b, D)
	for r := 0; r < rows; r++ {
		xs := m.f32(x.Add(int64(4*r*ldx)), D)
		ys := m.f32(y.Add(int64(4*r*ldy)), D)
		kern.LayerNorm(ys, xs, ws, bs, float64(eps))
	}
	return nil
}

func (m *emuDevice) rope(x, pos, cos, sin cuda.DevPtr, rows, rowsPerTok, ld, off, rot int, interleaved bool) error {
	half := rot / 2
	ps := m.i32(pos, (rows-1)/rowsPerTok+1)
	for r := 0; r < rows; r++ {
		p := int(ps[r/rowsPerTok])
		c := m.f32(cos.Add(int64(4*p*half)), half)
		s := m.f32(sin.Add(int64(4*p*half)), half)
		xr := m.f32(x.Add(int64(4*(r*ld+off))), rot)
		if interleaved {
			kern.ApplyInterleaved(xr, c, s)
		} else {
			kern.ApplyHalf(xr, c, s)
		}
	}
	return nil
}

func (m *emuDevice) add(y, a, b cuda.DevPtr, n int) error {
	ys, as, bs := m.f32(y, n), m.f32(a, n), m.f32(b, n)
	for i := range ys {
		ys[i] = as[i] + bs[i]
	}
	return nil
}

// addRMSNorm is the two operations it fuses, row by row.
func (m *emuDevice) addRMSNorm(y, x, b, w cuda.DevPtr, rows, D, ldx, ldb, ldy int, eps float32) error {
	for r := 0; r < rows; r++ {
		xr := x.Add(int64(4 * r * ldx))
		if err := m.add(xr, xr, b.Add(int64(4*r*ldb)), D); err != nil {
			return err
		}
	}
	return m.rmsnorm(y, x, w, rows, D, ldx, ldy, eps)
}

func (m *emuDevice) siluMul(out, gate, up cuda.DevPtr, rows, I, ldg, ldu, ldo int) error {
	for r := 0; r < rows; r++ {
		g := m.f32(gate.Add(int64(4*r*ldg)), I)
		u := m.f32(up.Add(int64(4*r*ldu)), I)
		o := m.f32(out.Add(int64(4*r*ldo)), I)
		kern.SiLUMul(o, g, u)
	}
	return nil
}

func (m *emuDevice) embed(out, table, ids cuda.DevPtr, T, D, V int) error {
	id := m.i32(ids, T)
	for t := 0; t < T; t++ {
		o := m.f32(out.Add(int64(4*t*D)), D)
		if id[t] < 0 || int(id[t]) >= V {
			for i := range o {
				o[i] = float32(math.NaN())
			}
			continue
		}
		row := m.u16(table.Add(int64(2*int(id[t])*D)), D)
		for i := range o {
			o[i] = numeric.BF16ToFloat32(row[i])
		}
	}
	return nil
}

func (m *emuDevice) moeCombine(out, y, w, resid cuda.DevPtr, k, N int) error {
	ys, ws, os := m.f32(y, k*N), m.f32(w, k), m.f32(out, N)
	var rs []float32
	if resid != 0 {
		rs = m.f32(resid, N)
	}
	for n := 0; n < N; n++ {
		var s float32
		for j := 0; j < k; j++ {
			s += ws[j] * ys[j*N+n]
		}
		if rs != nil {
			s = rs[n] + s
		}
		os[n] = s
	}
	return nil
}

// moeRoute is the CPU engine's router rule (sigmoid, bias for the choice,
// DeepSeek group limiting, normalised weights times the scaling factor).
func (m *emuDevice) moeRoute(idx, wts, logits, bias cuda.DevPtr, T, E, K, ngroup, topkGroup int, norm bool, scale float32) error {
	var bs []float32
	if bias != 0 {
		bs = m.f32(bias, E)
	}
	ids, ws := m.i32(idx, T*K), m.f32(wts, T*K)
	for t := 0; t < T; t++ {
		lg := m.f32(logits.Add(int64(4*t*E)), E)
		s := make([]float32, E)
		choice := make([]float32, E)
		for i, v := range lg {
			s[i] = kern.Sigmoid(v)
			choice[i] = s[i]
			if bs != nil {
				choice[i] += bs[i]
			}
		}
		if ngroup > 1 && topkGroup < ngroup {
			per := E / ngroup
			gs := make([]float32, ngroup)
			for g := 0; g < ngroup; g++ {
				for _, j := range kern.TopK(choice[g*per:(g+1)*per], 2) {
					gs[g] += choice[g*per+j]
				}
			}
			keep := make([]bool, ngroup)
			for _, g := range kern.TopK(gs, topkGroup) {
				keep[g] = true
			}
			for g := 0; g < ngroup; g++ {
				if !keep[g] {
					for j := g * per; j < (g+1)*per; j++ {
						choice[j] = float32(math.Inf(-1))
					}
				}
			}
		}
		sel := kern.TopK(choice, K)
		var sum float32
		for _, j := range sel {
			sum += s[j]
		}
		if norm {
			sum += 1e-20
		}
		for r, j := range sel {
			w := s[j]
			if norm {
				w /= sum
			}
			ids[t*K+r] = int32(j)
			ws[t*K+r] = w * scale
		}
	}
	return nil
}

func (m *emuDevice) indexerScores(f32 bool, out, q, w, cache, lens cuda.DevPtr, nq, H, T, ldOut int, qkScale float32) error {
	const D = kernels.IndexerHeadDim
	ls := m.i32(lens, nq)
	// key(t) is the kernel's read of cached key t: the fp8 page entry
	// dequantised, or the float32 entry of exact mode.
	var key func(k []float32, t int)
	if f32 {
		maxLen := 0
		for _, l := range ls {
			maxLen = max(maxLen, min(int(l), T))
		}
		kc := m.f32(cache, maxLen*D)
		key = func(k []float32, t int) { copy(k, kc[t*D:(t+1)*D]) }
	} else {
		pages := (T + engine.BlockSize - 1) / engine.BlockSize
		cb := m.mem(cache, pages*kernels.IndexerPageBytes)
		key = func(k []float32, t int) {
			pg := t / engine.BlockSize
			engine.DecodeIndexerKey(k, cb[pg*kernels.IndexerPageBytes:(pg+1)*kernels.IndexerPageBytes], t%engine.BlockSize)
		}
	}
	k := make([]float32, D)
	for i := 0; i < nq; i++ {
		qs := m.f32(q.Add(int64(4*i*H*D)), H*D)
		wi := m.f32(w.Add(int64(4*i*H)), H)
		o := m.f32(out.Add(int64(4*i*ldOut)), T)
		for t := 0; t < T; t++ {
			if t >= int(ls[i]) {
				o[t] = float32(math.Inf(-1))
				continue
			}
			key(k, t)
			var s float32
			for h := 0; h < H; h++ {
				if d := kern.Dot(qs[h*D:(h+1)*D], k) * qkScale; d > 0 {
					s += wi[h] * d
				}
			}
			o[t] = s
		}
	}
	return nil
}

func (m *emuDevice) indexerQPrep(qh, wq, q, w, pos, cos, sin cuda.DevPtr, M, H, rot int, interleaved bool, wscale float32) error {
	const D = kernels.IndexerHeadDim
	if H > kernels.IndexerQHeads || rot > D {
		return errors.Newf("emu indexer q prep: H=%d rot=%d", H, rot)
	}
	half := rot / 2
	ps := m.i32(pos, M)
	v := make([]float32, D)
	for r := 0; r < M; r++ {
		codes := m.mem(qh.Add(int64(r*kernels.IndexerQRowBytes)), kernels.IndexerQRowBytes)
		wo := m.f32(wq.Add(int64(4*r*kernels.IndexerQHeads)), kernels.IndexerQHeads)
		clear(codes)
		clear(wo)
		p := int(ps[r])
		c := m.f32(cos.Add(int64(4*p*half)), half)
		s := m.f32(sin.Add(int64(4*p*half)), half)
		ws := m.f32(w.Add(int64(4*r*H)), H)
		for h := 0; h < H; h++ {
			copy(v, m.f32(q.Add(int64(4*(r*H+h)*D)), D))
			if interleaved {
				kern.ApplyInterleaved(v[:rot], c, s)
			} else {
				kern.ApplyHalf(v[:rot], c, s)
			}
			var amax float32
			for _, x := range v {
				amax = max(amax, float32(math.Abs(float64(x))))
			}
			sc := engine.UE8M0Ceil(max(amax, 1e-10) / 448)
			for d, x := range v {
				codes[kernels.IndexerQByte(h, d)] = numeric.Float32ToFP8E4M3(x / sc)
			}
			wo[h] = ws[h] * wscale * sc
		}
	}
	return nil
}

// topKAfterHist is topK: the emulator keeps no histogram. It stands for
// every top-k kernel (topk_radix_one_w, TILERT_GPU_TOPK_FAST's topk_fast: the
// same selection, element for element, checked against refTopK on the GPU).
func (m *emuDevice) topKAfterHist(out, scores, lens, scratch cuda.DevPtr, rows, T, K, ld, ldOut int) error {
	return m.topK(out, scores, lens, scratch, rows, T, K, ld, ldOut)
}

func (m *emuDevice) indexerScoresQ(out, qh, wq, cache, lens, _ cuda.DevPtr, nq, T, ldOut int) error {
	const D, PB = kernels.IndexerHeadDim, kernels.IndexerPageBytes
	ls := m.i32(lens, nq)
	cb := m.mem(cache, (T+engine.BlockSize-1)/engine.BlockSize*PB)
	q := make([]float32, kernels.IndexerQHeads*D)
	k := make([]float32, D)
	for i := 0; i < nq; i++ {
		codes := m.mem(qh.Add(int64(i*kernels.IndexerQRowBytes)), kernels.IndexerQRowBytes)
		for h := 0; h < kernels.IndexerQHeads; h++ {
			for d := 0; d < D; d++ {
				q[h*D+d] = numeric.FP8E4M3ToFloat32(codes[kernels.IndexerQByte(h, d)])
			}
		}
		wi := m.f32(wq.Add(int64(4*i*kernels.IndexerQHeads)), kernels.IndexerQHeads)
		o := m.f32(out.Add(int64(4*i*ldOut)), T)
		for t := 0; t < T; t++ {
			if t >= int(ls[i]) {
				o[t] = float32(math.Inf(-1))
				continue
			}
			pg := cb[t/engine.BlockSize*PB:]
			tp := t % engine.BlockSize
			for d := 0; d < D; d++ {
				k[d] = numeric.FP8E4M3ToFloat32(pg[tp*D+d])
			}
			var s float32
			for h := 0; h < kernels.IndexerQHeads; h++ {
				if d := kern.Dot(q[h*D:(h+1)*D], k); d > 0 {
					s += wi[h] * d
				}
			}
			o[t] = s * math.Float32frombits(binary.LittleEndian.Uint32(pg[engine.BlockSize*D+4*tp:]))
		}
	}
	return nil
}

func (m *emuDevice) topK(out, scores, lens, _ cuda.DevPtr, rows, T, K, ld, ldOut int) error {
	var ls []int32
	if lens != 0 {
		ls = m.i32(lens, rows)
	}
	for r := 0; r < rows; r++ {
		n := T
		if ls != nil && int(ls[r]) < n {
			n = int(ls[r])
		}
		o := m.i32(out.Add(int64(4*r*ldOut)), K)
		if n <= K {
			for j := range o {
				o[j] = -1
				if j < n {
					o[j] = int32(j)
				}
			}
			continue
		}
		sel := kern.TopK(m.f32(scores.Add(int64(4*r*ld)), n), K)
		sort.Ints(sel)
		for j, t := range sel {
			o[j] = int32(t)
		}
	}
	return nil
}

// mlaEntry decodes cached MLA token t of a region of the given kind.
func (m *emuDevice) mlaEntry(kind mlaKind, cache cuda.DevPtr, t int, lat, rp []float32) {
	switch kind {
	case mlaF32:
		v := m.f32(cache.Add(int64(t*kernels.MLAF32TokenBytes)), kernels.MLALatentDim+kernels.MLARopeDim)
		copy(lat, v[:kernels.MLALatentDim])
		copy(rp, v[kernels.MLALatentDim:])
	case mlaBF16:
		engine.DecodeMLABF16(lat, rp, m.mem(cache.Add(int64(t*kernels.MLABF16TokenBytes)), kernels.MLABF16TokenBytes))
	default:
		engine.DecodeMLAFP8(lat, rp, m.mem(cache.Add(int64(t*kernels.MLATokenBytes)), kernels.MLATokenBytes))
	}
}

// mlaDecode stands for every fp8 MLA decode kernel (mla_decode_tc / tcf2,
// TILERT_GPU_MLA_FEW's mla_decode_few: the same operation, float32 rounding
// apart; each checked against float64 on the GPU).
func (m *emuDevice) mlaDecode(kind mlaKind, out, qn, qp, cache, indices, lens, _ cuda.DevPtr, nq, H, nidx, ldIdx int, scale float32) error {
	const R, P = kernels.MLALatentDim, kernels.MLARopeDim
	ls := m.i32(lens, nq)
	for i := 0; i < nq; i++ {
		var toks []int
		ix := m.i32(indices.Add(int64(4*i*ldIdx)), nidx)
		for _, t := range ix {
			if t >= 0 && t < ls[i] {
				toks = append(toks, int(t))
			}
		}
		lat := make([]float32, len(toks)*R)
		rp := make([]float32, len(toks)*P)
		for j, t := range toks {
			m.mlaEntry(kind, cache, t, lat[j*R:(j+1)*R], rp[j*P:(j+1)*P])
		}
		sc := make([]float32, len(toks))
		for h := 0; h < H; h++ {
			ql := m.f32(qn.Add(int64(4*(i*H+h)*R)), R)
			qr := m.f32(qp.Add(int64(4*(i*H+h)*P)), P)
			o := m.f32(out.Add(int64(4*(i*H+h)*R)), R)
			for j := range toks {
				sc[j] = (kern.Dot(ql, lat[j*R:(j+1)*R]) + kern.Dot(qr, rp[j*P:(j+1)*P])) * scale
			}
			kern.Softmax(sc)
			clear(o)
			for j := range toks {
				kern.Axpy(o, sc[j], lat[j*R:(j+1)*R])
			}
		}
	}
	return nil
}

// mlaPrefill is mla_prefill_tc: mla_decode_tc's arithmetic (float32
// products, online softmax with the same scale, skipped and past-length
// entries masked) for many rows, each row on its own selection, so the
// same float32 transcription as mlaDecode's fp8 path row by row.
func (m *emuDevice) mlaPrefill(mode int, out, qn, qp, cache, indices, lens, _ cuda.DevPtr, nq, H, nidx, ldIdx int, scale float32) error {
	const R, P = kernels.MLALatentDim, kernels.MLARopeDim
	if nq <= 0 || H <= 0 || nidx <= 0 || ldIdx < nidx || indices == 0 {
		return errors.Newf("emu mlaPrefill: nq=%d H=%d nidx=%d ldIdx=%d indices=%#x", nq, H, nidx, ldIdx, uint64(indices))
	}
	if mode == 4 || mode == 5 || mode == 6 { // mla_prefill_wg / wg2: mla_prefill_h1's function and roundings
		return m.mlaPrefillH1(out, qn, qp, cache, indices, lens, nq, H, nidx, ldIdx, scale)
	}
	for i := 0; i < nq; i++ {
		if err := m.mlaDecode(mlaFP8, out.Add(int64(4*i*H*R)), qn.Add(int64(4*i*H*R)), qp.Add(int64(4*i*H*P)), cache,
			indices.Add(int64(4*i*ldIdx)), lens.Add(int64(4*i)), 0, 1, H, nidx, ldIdx, scale); err != nil {
			return err
		}
	}
	return nil
}

// mlaDecodeRows is mlaDecode row by row, each on its slot's region.
func (m *emuDevice) mlaDecodeRows(out, qn, qp cuda.DevPtr, cacheOff int64, rowBase, indices, lens, _ cuda.DevPtr, nq, H, nidx, ldIdx int, scale float32) error {
	const R, P = kernels.MLALatentDim, kernels.MLARopeDim
	bases := m.mem(rowBase, 8*nq)
	for i := 0; i < nq; i++ {
		cache := cuda.DevPtr(binary.LittleEndian.Uint64(bases[8*i:]) + uint64(cacheOff))
		if err := m.mlaDecode(mlaFP8, out.Add(int64(4*i*H*R)), qn.Add(int64(4*i*H*R)), qp.Add(int64(4*i*H*P)), cache,
			indices.Add(int64(4*i*ldIdx)), lens.Add(int64(4*i)), 0, 1, H, nidx, ldIdx, scale); err != nil {
			return err
		}
	}
	return nil
}

// indexerScoresQRows is indexerScoresQ row by row, each on its slot's pages.
func (m *emuDevice) indexerScoresQRows(out, qh, wq cuda.DevPtr, cacheOff int64, rowBase, lens, _ cuda.DevPtr, nq, T, ldOut int) error {
	bases := m.mem(rowBase, 8*nq)
	for i := 0; i < nq; i++ {
		cache := cuda.DevPtr(binary.LittleEndian.Uint64(bases[8*i:]) + uint64(cacheOff))
		if err := m.indexerScoresQ(out.Add(int64(4*i*ldOut)), qh.Add(int64(i*kernels.IndexerQRowBytes)),
			wq.Add(int64(4*i*kernels.IndexerQHeads)), cache, lens.Add(int64(4*i)), 0, 1, T, ldOut); err != nil {
			return err
		}
	}
	return nil
}

// argmax needs no scratch: every block split gives the same arg-max.
func (m *emuDevice) argmax(out, x, _ cuda.DevPtr, rows, n, ld int) error {
	o := m.i32(out, rows)
	for r := 0; r < rows; r++ {
		o[r] = int32(engine.Argmax(m.f32(x.Add(int64(4*r*ld)), n)))
	}
	return nil
}

// sample draws like the CPU engine (engine.Sample at position p.Step), not
// like the device's Gumbel-max kernel: the emulator stands in for the CPU
// path here, and no test compares sampled tokens across backends.
func (m *emuDevice) sample(out, logits, _ cuda.DevPtr, n int, p kernels.SamplingParams) error {
	tk := p.TopK
	ep := engine.Params{Temperature: float64(p.Temperature), TopK: tk, TopP: float64(p.TopP), MinP: float64(p.MinP), Seed: p.Seed}
	step := int(p.Step)
	if p.StepAt != 0 {
		step += int(m.i32(p.StepAt, 1)[0])
	}
	m.i32(out, 1)[0] = int32(engine.Sample(m.f32(logits, n), ep, step))
	return nil
}

// adjustLogits is the CPU engine's engine.ApplyAdjust, entry by entry: the
// same float32 operations as the kernel.
func (m *emuDevice) adjustLogits(x, entries cuda.DevPtr, n, ld int) error {
	w := m.i32(entries, kernels.AdjustWords*n)
	for i := 0; i < n; i++ {
		a := w[kernels.AdjustWords*i:]
		row := m.f32(x.Add(int64(4*int(a[0])*ld)), ld)
		engine.ApplyAdjust(row, []engine.LogitAdjust{{Tok: int(a[1]), Bias: math.Float32frombits(uint32(a[2])),
			Rep: math.Float32frombits(uint32(a[3])), Sub: math.Float32frombits(uint32(a[4])), Block: a[5] != 0}})
	}
	return nil
}

// logprobs is engine.Logprobs (float64; the kernel's float32 agrees to ~1e-5).
func (m *emuDevice) logprobs(x, tok, lp, topID, topLP cuda.DevPtr, rows, n, ld, k int) error {
	toks, lps := m.i32(tok, rows), m.f32(lp, rows)
	ids, tlp := m.i32(topID, rows*max(k, 1)), m.f32(topLP, rows*max(k, 1))
	for r := 0; r < rows; r++ {
		res := engine.Logprobs(m.f32(x.Add(int64(4*r*ld)), n), int(toks[r]), k)
		lps[r] = res.Logprob
		for j, a := range res.Top {
			ids[r*k+j], tlp[r*k+j] = int32(a.ID), a.Logprob
		}
	}
	return nil
}

func (m *emuDevice) mlaCacheWrite(kind mlaKind, cache, src, pos cuda.DevPtr, n, ld int) error {
	const R, P = kernels.MLALatentDim, kernels.MLARopeDim
	ps := m.i32(pos, n)
	for i := 0; i < n; i++ {
		if ps[i] < 0 {
			continue
		}
		p := int(ps[i])
		s := m.f32(src.Add(int64(4*i*ld)), R+P)
		switch kind {
		case mlaF32:
			copy(m.f32(cache.Add(int64(p*kernels.MLAF32TokenBytes)), R+P), s)
		case mlaBF16:
			engine.EncodeMLABF16(m.mem(cache.Add(int64(p*kernels.MLABF16TokenBytes)), kernels.MLABF16TokenBytes), s[:R], s[R:])
		default:
			engine.EncodeMLAFP8(m.mem(cache.Add(int64(p*kernels.MLATokenBytes)), kernels.MLATokenBytes), s[:R], s[R:])
		}
	}
	return nil
}

func (m *emuDevice) idxCacheWrite(f32 bool, cache, src, pos cuda.DevPtr, n, ld int) error {
	const D = kernels.IndexerHeadDim
	ps := m.i32(pos, n)
	for i := 0; i < n; i++ {
		if ps[i] < 0 {
			continue
		}
		p := int(ps[i])
		k := m.f32(src.Add(int64(4*i*ld)), D)
		if f32 {
			copy(m.f32(cache.Add(int64(p*kernels.IndexerF32Bytes)), D), k)
			continue
		}
		pg := m.mem(cache.Add(int64((p/engine.BlockSize)*kernels.IndexerPageBytes)), kernels.IndexerPageBytes)
		engine.EncodeIndexerKey(pg, p%engine.BlockSize, k)
	}
	return nil
}

func (m *emuDevice) quantUE8M0(x cuda.DevPtr, n int) error {
	if n%128 != 0 {
		return errors.Newf("emu quant: n=%d", n)
	}
	engine.QuantFP8UE8M0(m.f32(x, n))
	return nil
}

func (m *emuDevice) copy2D(dst, src cuda.DevPtr, rows, cols, ldd, lds int) error {
	for r := 0; r < rows; r++ {
		copy(m.f32(dst.Add(int64(4*r*ldd)), cols), m.f32(src.Add(int64(4*r*lds)), cols))
	}
	return nil
}

func (m *emuDevice) scale(x cuda.DevPtr, a float32, n int) error {
	kern.Scale(m.f32(x, n), a)
	return nil
}

// headRows returns row (h, r) of an absorbed matrix [H][rows][R], dequantised.
func (m *emuDevice) headRow(dst []float32, w, s cuda.DevPtr, fp8 bool, idx, R int) {
	if fp8 {
		rb := (R + 127) / 128
		fp8Row(dst, m.mem(w.Add(int64(idx*R)), R), m.f32(s.Add(int64(4*idx*rb)), rb))
		return
	}
	copy(dst, m.f32(w.Add(int64(4*idx*R)), R))
}

// qRopePart copies q's RoPE part (the last P of each head's hs values,
// rows ldq apart) into qpe ([M][H][P]) and rotates it: absorbQ's second
// output, the same in every absorb kernel (none when qpe is 0).
func (m *emuDevice) qRopePart(qpe, q cuda.DevPtr, M, H, nope, ldq, hs, P int, rope kernels.QRope) error {
	for r := 0; r < M && qpe != 0; r++ {
		if err := m.copy2D(qpe.Add(int64(4*r*H*P)), q.Add(int64(4*(r*ldq+nope))), H, P, P, hs); err != nil {
			return err
		}
	}
	if qpe != 0 && rope.Pos != 0 {
		if err := m.rope(qpe, rope.Pos, rope.Cos, rope.Sin, M*H, H, P, 0, P, rope.Interleaved); err != nil {
			return err
		}
	}
	return nil
}

func (m *emuDevice) absorbQ(out, qpe, q, w, s cuda.DevPtr, fp8 bool, M, H, nope, R, ldq, hs, P int, rope kernels.QRope, qs kernels.QScale) error {
	row := make([]float32, R)
	if err := m.qRopePart(qpe, q, M, H, nope, ldq, hs, P, rope); err != nil {
		return err
	}
	if qs.On() {
		// The one-row kernels' order: the outputs as unscaled, then each
		// times r (below).
		defer func() {
			r := m.qaScale(qs)
			scaleF32(m.f32(out, M*H*R), r)
			if qpe != 0 {
				scaleF32(m.f32(qpe, M*H*P), r)
			}
		}()
	}
	for r := 0; r < M; r++ {
		qs := m.f32(q.Add(int64(4*r*ldq)), (H-1)*hs+nope)
		for h := 0; h < H; h++ {
			o := m.f32(out.Add(int64(4*(r*H+h)*R)), R)
			clear(o)
			for d := 0; d < nope; d++ {
				m.headRow(row, w, s, fp8, h*nope+d, R)
				kern.Axpy(o, qs[h*hs+d], row)
			}
		}
	}
	return nil
}

func (m *emuDevice) absorbV(out, x, w, s cuda.DevPtr, fp8 bool, M, H, vd, R, ldo int) error {
	row := make([]float32, R)
	for r := 0; r < M; r++ {
		o := m.f32(out.Add(int64(4*r*ldo)), H*vd)
		for h := 0; h < H; h++ {
			xs := m.f32(x.Add(int64(4*(r*H+h)*R)), R)
			for v := 0; v < vd; v++ {
				m.headRow(row, w, s, fp8, h*vd+v, R)
				o[h*vd+v] = kern.Dot(row, xs)
			}
		}
	}
	return nil
}

// emuRunner runs engine work on the emulator, turning a panic (an
// out-of-range access) into an error.
type emuRunner struct{ m *emuDevice }

func (r *emuRunner) run(f func(b device) error) error { return r.runWith(r.m, f) }

func (r *emuRunner) runAhead(f func(b device) (bool, error)) error {
	return r.runWith(r.m, func(b device) error {
		_, err := f(b)
		return err
	})
}

// runWith runs f on b (the emulator or a wrapper of it).
func (r *emuRunner) runWith(b device, f func(b device) error) (err error) {
	defer func() {
		if p := recover(); p != nil {
			if e, ok := p.(error); ok {
				err = errors.Wrap(e, "emulated device")
				return
			}
			err = errors.Newf("emulated device: panic: %v", p)
		}
	}()
	return f(b)
}

func (r *emuRunner) close() error { return nil }

// attnEpilogue is the launches it fuses, row by row (a row at a negative
// position is left alone, as the kernel does), then indexerQPrep. With
// row bases each row writes its own slot's caches.
func (m *emuDevice) attnEpilogue(a kernels.AttnEpilogue) error {
	if err := a.Check(); err != nil {
		return err
	}
	ps := m.i32(a.Pos, a.Rows)
	var bases []byte
	if a.Bases != 0 {
		bases = m.mem(a.Bases, 8*a.Rows)
	}
	for i := 0; i < a.Rows; i++ {
		if ps[i] < 0 {
			continue
		}
		pos := fptr(a.Pos, i)
		mla, idx := a.MLACache, a.IdxCache
		if bases != nil {
			b := cuda.DevPtr(binary.LittleEndian.Uint64(bases[8*i:]))
			if a.MLARows {
				mla = b.Add(a.MLAOff)
			}
			if a.IdxRows {
				idx = b.Add(a.IdxOff)
			}
		}
		if mla != 0 {
			kv := fptr(a.KVA, i*a.LdKV)
			if err := errors.CombineErrors(m.rmsnorm(kv, kv, a.KVNorm, 1, kernels.MLALatentDim, a.LdKV, a.LdKV, a.KVEps),
				m.rope(kv, pos, a.Cos, a.Sin, 1, 1, a.LdKV, kernels.MLALatentDim, a.Rot, a.KVInterleaved)); err != nil {
				return err
			}
			if err := m.mlaCacheWrite(mlaFP8, mla, kv, pos, 1, a.LdKV); err != nil {
				return err
			}
		}
		if idx != 0 {
			ik := fptr(a.IK, i*a.LdIK)
			const D = kernels.IndexerHeadDim
			if err := errors.CombineErrors(m.layernorm(ik, ik, a.IKNormW, a.IKNormB, 1, D, a.LdIK, a.LdIK, a.IKEps),
				m.rope(ik, pos, a.Cos, a.Sin, 1, 1, a.LdIK, 0, a.Rot, a.IdxInterleaved)); err != nil {
				return err
			}
			if err := m.idxCacheWrite(false, idx, ik, pos, 1, a.LdIK); err != nil {
				return err
			}
		}
	}
	if a.QH == 0 {
		return nil
	}
	iq := a.IQ
	if a.QS.On() {
		// attn_epilogue_qs: the query times RMSNorm's scale first (into a
		// copy: the kernel leaves IQ as it is).
		n := a.Rows * a.IH * kernels.IndexerHeadDim
		t, err := m.alloc(int64(4 * n))
		if err != nil {
			return err
		}
		defer m.free(t)
		copy(m.f32(t, n), m.f32(a.IQ, n))
		scaleF32(m.f32(t, n), m.qaScale(a.QS))
		iq = t
	}
	return m.indexerQPrep(a.QH, a.WQ, iq, a.IW, a.Pos, a.Cos, a.Sin, a.Rows, a.IH, a.Rot, a.IdxInterleaved, a.WScale)
}
