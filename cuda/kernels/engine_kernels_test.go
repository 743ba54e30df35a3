package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"regexp"
	"testing"

	"github.com/tilert-go/tilert/cuda"
	"github.com/tilert-go/tilert/engine"
)

// Checks of kernels/engine.cu against the engine package's own encoders
// (byte-exact) and float64 references.

func TestEngineKernelLaunchesDefined(t *testing.T) { checkLaunchesDefined(t, "engine_ops.go", 7) }

// checkLaunchesDefined fails for a k.launch("name", ...) in the Go file that
// names no kernel of the embedded source (caught here, not at a GPU's
// first launch); fewer than min launches found means the pattern broke.
func checkLaunchesDefined(t *testing.T, file string, min int) {
	t.Helper()
	src := KernelSource()
	ops, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	uses := regexp.MustCompile(`k\.launch\("(\w+)"`).FindAllStringSubmatch(string(ops), -1)
	if len(uses) < min {
		t.Fatalf("%d launches found in %s, want at least %d", len(uses), file, min)
	}
	for _, u := range uses {
		if !regexp.MustCompile(`extern "C" __global__ void(?: __launch_bounds__\(\d+\))?\s+` + u[1] + `\(`).MatchString(src) {
			t.Errorf("%s launches %s, not defined in the kernels", file, u[1])
		}
	}
}

func TestKernelEngineCacheWrites(t *testing.T) {
	onGPU(t, func(c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand) {
		s := c.Stream()
		const ntok, nPages, ld = 6, 3, 576 + 8
		src := randF32(r, ntok*ld, 1)
		for i := 0; i < 128; i++ {
			src[ld+128+i] *= 1e3     // a group with a large scale
			src[2*ld+i] = 0          // an all-zero group: scale FLT_MIN
			src[3*ld+256+i] *= 1e-30 // tiny values
		}
		pos := []int32{70, 3, -1, 191, 64, 0}
		cache := make([]byte, nPages*64*MLATokenBytes)
		for i := range cache {
			cache[i] = 0xab
		}
		cp := a.up(cache)
		chk(k.EngMLACacheWrite(s, cp, a.up(src), a.up(pos), ntok, ld))
		got := make([]byte, len(cache))
		chk(c.Download(got, cp))
		want := append([]byte(nil), cache...)
		for i, p := range pos {
			if p >= 0 {
				engine.EncodeMLAFP8(want[int(p)*MLATokenBytes:(int(p)+1)*MLATokenBytes], src[i*ld:i*ld+512], src[i*ld+512:i*ld+576])
			}
		}
		record(t, "eng_mla_cache_write vs engine.EncodeMLAFP8", "mismatched bytes", float64(diffBytes(got, want)), 0)

		const ild = 136
		keys := randF32(r, ntok*ild, 0.5)
		for i := 0; i < 128; i++ {
			keys[ild+i] *= 1e-6 // amax under the 1e-4 floor
		}
		icache := make([]byte, nPages*IndexerPageBytes)
		for i := range icache {
			icache[i] = 0xcd
		}
		ip := a.up(icache)
		chk(k.EngIndexerCacheWrite(s, ip, a.up(keys), a.up(pos), ntok, ild))
		igot := make([]byte, len(icache))
		chk(c.Download(igot, ip))
		iwant := append([]byte(nil), icache...)
		for i, p := range pos {
			if p >= 0 {
				pg := iwant[int(p/64)*IndexerPageBytes : int(p/64+1)*IndexerPageBytes]
				engine.EncodeIndexerKey(pg, int(p%64), keys[i*ild:i*ild+128])
			}
		}
		record(t, "eng_indexer_cache_write vs engine.EncodeIndexerKey", "mismatched bytes", float64(diffBytes(igot, iwant)), 0)

		q := randF32(r, 7*128, 3)
		for i := 0; i < 128; i++ {
			q[128+i] *= 1e-12
			q[256+i] = 0
		}
		qp := a.up(q)
		chk(k.EngQuantUE8M0(s, qp, len(q)))
		qgot := downF32(c, qp, len(q))
		engine.QuantFP8UE8M0(q)
		bad := 0
		for i := range q {
			if math.Float32bits(q[i]) != math.Float32bits(qgot[i]) {
				bad++
			}
		}
		record(t, "eng_quant_ue8m0 vs engine.QuantFP8UE8M0", "mismatched values", float64(bad), 0)
	})
}

func TestKernelEngineAbsorbCopyScale(t *testing.T) {
	onGPU(t, func(c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand) {
		s := c.Stream()
		for _, sh := range []struct{ M, H, nope, vd, R int }{{1, 4, 32, 32, 512}, {3, 5, 64, 48, 512}, {2, 16, 128, 128, 512}} {
			for _, fp8 := range []bool{true, false} {
				M, H, nope, vd, R := sh.M, sh.H, sh.nope, sh.vd, sh.R
				hs := nope + 64
				ldq := H*hs + 4
				q := randF32(r, M*ldq, 1)
				wk := func(n int) (cuda.DevPtr, cuda.DevPtr, func(row, c int) float64) {
					if fp8 {
						return randFP8Rows(r, a, n, R)
					}
					w := randF32(r, n*R, 0.05)
					return a.up(w), 0, func(row, col int) float64 { return float64(w[row*R+col]) }
				}
				ukp, uks, uk := wk(H * nope)
				out := a.poisoned(M * H * R)
				chk(k.EngAbsorbQ(s, out, a.up(q), ukp, uks, fp8, M, H, nope, R, ldq, hs))
				ref := make([]float64, M*H*R)
				for m := 0; m < M; m++ {
					for h := 0; h < H; h++ {
						for col := 0; col < R; col++ {
							var acc float64
							for d := 0; d < nope; d++ {
								acc += uk(h*nope+d, col) * float64(q[m*ldq+h*hs+d])
							}
							ref[(m*H+h)*R+col] = acc
						}
					}
				}
				tag := fmt.Sprintf("M=%d H=%d nope=%d fp8=%v", M, H, nope, fp8)
				record(t, "eng_absorb_q "+tag, relMetric, relErr(downF32(c, out, M*H*R), ref), boundF32)

				x := randF32(r, M*H*R, 1)
				uvp, uvs, uv := wk(H * vd)
				ldo := H*vd + 3
				vo := a.poisoned(M * ldo)
				chk(k.EngAbsorbV(s, vo, a.up(x), uvp, uvs, fp8, M, H, vd, R, ldo))
				vref := make([]float64, M*ldo)
				for i := range vref {
					vref[i] = math.NaN() // padding columns: not written, not compared
				}
				vgot := downF32(c, vo, M*ldo)
				var gotC []float32
				var refC []float64
				for m := 0; m < M; m++ {
					for h := 0; h < H; h++ {
						for v := 0; v < vd; v++ {
							var acc float64
							for col := 0; col < R; col++ {
								acc += uv(h*vd+v, col) * float64(x[(m*H+h)*R+col])
							}
							gotC = append(gotC, vgot[m*ldo+h*vd+v])
							refC = append(refC, acc)
						}
					}
				}
				record(t, "eng_absorb_v "+tag, relMetric, relErr(gotC, refC), boundF32)
			}
		}

		rows, cols, lds, ldd := 37, 64, 192, 70
		src := randF32(r, rows*lds, 1)
		dst := a.poisoned(rows * ldd)
		chk(k.EngCopy2D(s, dst, a.up(src), rows, cols, ldd, lds))
		got := downF32(c, dst, rows*ldd)
		bad := 0
		for i := 0; i < rows; i++ {
			for j := 0; j < ldd; j++ {
				g := got[i*ldd+j]
				if j < cols && g != src[i*lds+j] || j >= cols && !math.IsNaN(float64(g)) {
					bad++
				}
			}
		}
		record(t, "eng_copy2d (strided rows, padding untouched)", "mismatched values", float64(bad), 0)

		v := randF32(r, 1000, 1)
		vp := a.up(v)
		chk(k.EngScale(s, vp, 0.125, len(v)))
		vg := downF32(c, vp, len(v))
		bad = 0
		for i := range v {
			if vg[i] != v[i]*0.125 {
				bad++
			}
		}
		record(t, "eng_scale", "mismatched values", float64(bad), 0)
	})
}
