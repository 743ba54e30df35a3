package kernels

// How fast one SM streams weights, by load form and by how many SMs stream
// at once (issue 10). Session 15 read from o_proj's plans that "an SM
// streams at about its share of the copy rate however early the others
// finish", so every one-row GEMV takes its busiest SM's bytes and a
// launch's tail runs at a fraction of the card. The one-row GEMVs load
// with 16-byte ld.global (16 in flight a thread, _d16); the staged GEMV
// with 16-byte cp.async; nothing yet with the bulk copy engine
// (cp.async.bulk, sm_90), which moves a whole range per instruction and
// keeps no per-thread request in flight. This probe streams the same bytes
// a block (1 MiB: o_proj's busiest SM reads 64 rows of 16 KiB) on B blocks,
// one an SM, in the three forms, checks every block's XOR of its words
// exactly, and reports the time and the per-SM rate next to a
// device-to-device copy's (TILERT_GPU_TIMING=1; never asserted).

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/tilert-go/tilert/cuda"
)

// smRateSource is common.cuh, gemv_tile.cuh (the tile GEMVs' load) and the
// three streaming kernels. Each block b
// XORs the 32-bit words of src[b*bytes .. (b+1)*bytes) into out[b]
// (zeroed before), reading them as its form does: sm_rate_ldg with 16-byte
// loads past L1, 16 in flight a thread; sm_rate_cpa through a ring of S
// shared-memory stages of CH bytes filled by 16-byte cp.async; sm_rate_bulk
// through the same ring filled by one cp.async.bulk a stage, completed on
// the stage's mbarrier. bytes % CH == 0 and CH % 4096 == 0.
func smRateSource() string {
	var src string
	for _, f := range []string{"cu/common.cuh", gemvTileHeader} {
		b, err := kernelFS.ReadFile(f)
		if err != nil {
			panic(err)
		}
		src += string(b) + "\n"
	}
	return src + `
#define SR_T 256
#define SR_CPA_S 4  // sm_rate_cpa's stages (cp.async.wait_group takes a constant)

__device__ __forceinline__ unsigned sr_x(uint4 v) { return v.x ^ v.y ^ v.z ^ v.w; }

extern "C" __global__ void __launch_bounds__(SR_T, 1) sm_rate_ldg(const uint4* __restrict__ src, long long bytes,
                                                                  unsigned* out) {
  const long long n = bytes >> 4;
  const uint4* p = src + (size_t)blockIdx.x * n;
  unsigned acc = 0;
  for (long long i = threadIdx.x; i < n; i += SR_T * 16) {
    uint4 v[16];
#pragma unroll
    for (int j = 0; j < 16; j++) {
      const long long k = i + (long long)j * SR_T;
      v[j] = k < n ? tile_ld16_normal(p + k) : make_uint4(0u, 0u, 0u, 0u);
    }
#pragma unroll
    for (int j = 0; j < 16; j++) acc ^= sr_x(v[j]);
  }
  atomicXor(out + blockIdx.x, acc);
}

extern "C" __global__ void __launch_bounds__(SR_T, 1) sm_rate_cpa(const unsigned char* __restrict__ src,
                                                                  long long bytes, unsigned* out, int CH) {
  extern __shared__ __align__(128) unsigned char sr_sh[];
  constexpr int S = SR_CPA_S;
  const unsigned char* p = src + (size_t)blockIdx.x * bytes;
  const int n = (int)(bytes / CH), per = CH / 16;
  unsigned acc = 0;
  for (int it = 0; it < n + S - 1; it++) {
    if (it < n) {
      const unsigned char* g = p + (size_t)it * CH;
      unsigned char* d = sr_sh + (size_t)(it % S) * CH;
      for (int i = threadIdx.x; i < per; i += SR_T) {
        const unsigned dst = (unsigned)__cvta_generic_to_shared(d + (size_t)i * 16);
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(g + (size_t)i * 16) : "memory");
      }
    }
    asm volatile("cp.async.commit_group;" ::: "memory");
    const int c = it - (S - 1);  // the stage consumed this round
    if (c < 0) continue;
    asm volatile("cp.async.wait_group %0;" ::"n"(SR_CPA_S - 1) : "memory");
    __syncthreads();
    const uint4* q = (const uint4*)(sr_sh + (size_t)(c % S) * CH);
    for (int i = threadIdx.x; i < per; i += SR_T) acc ^= sr_x(q[i]);
    __syncthreads();  // the stage is refilled next round
  }
  atomicXor(out + blockIdx.x, acc);
}

// The bulk copy's PTX (8.0) needs NVRTC 12+; an older NVRTC compiles the
// kernel empty and the test skips that form.
#if defined(__CUDACC_VER_MAJOR__) && __CUDACC_VER_MAJOR__ >= 12
#define SR_BULK 1
#endif

__device__ __forceinline__ void sr_bulk_issue(const unsigned char* g, unsigned char* d, unsigned long long* bar, int CH) {
#ifdef SR_BULK
  const unsigned b = (unsigned)__cvta_generic_to_shared(bar), dst = (unsigned)__cvta_generic_to_shared(d);
  unsigned long long st;
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 %0, [%1], %2;" : "=l"(st) : "r"(b), "r"(CH) : "memory");
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(dst),
               "l"(g), "r"(CH), "r"(b)
               : "memory");
#endif
}

extern "C" __global__ void __launch_bounds__(SR_T, 1) sm_rate_bulk(const unsigned char* __restrict__ src,
                                                                   long long bytes, unsigned* out, int S, int CH) {
#ifdef SR_BULK
  extern __shared__ __align__(128) unsigned char sr_sh[];
  __shared__ __align__(8) unsigned long long bar[8];
  const unsigned char* p = src + (size_t)blockIdx.x * bytes;
  const int n = (int)(bytes / CH), per = CH / 16;
  if (threadIdx.x == 0) {
    for (int s = 0; s < S; s++)
      asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"((unsigned)__cvta_generic_to_shared(bar + s)) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    for (int it = 0; it < S && it < n; it++) sr_bulk_issue(p + (size_t)it * CH, sr_sh + (size_t)it * CH, bar + it, CH);
  }
  __syncthreads();
  unsigned acc = 0;
  for (int it = 0; it < n; it++) {
    const int s = it % S;
    const unsigned b = (unsigned)__cvta_generic_to_shared(bar + s), ph = (unsigned)((it / S) & 1);
    asm volatile(
        "{\n .reg .pred P;\n"
        "SR_WAIT:\n mbarrier.try_wait.parity.shared::cta.b64 P, [%0], %1;\n @!P bra SR_WAIT;\n}" ::"r"(b),
        "r"(ph)
        : "memory");
    const uint4* q = (const uint4*)(sr_sh + (size_t)s * CH);
    for (int i = threadIdx.x; i < per; i += SR_T) acc ^= sr_x(q[i]);
    __syncthreads();  // every thread is done with stage s
    if (threadIdx.x == 0 && it + S < n) sr_bulk_issue(p + (size_t)(it + S) * CH, sr_sh + (size_t)s * CH, bar + s, CH);
  }
  atomicXor(out + blockIdx.x, acc);
#endif
}
`
}

// TestKernelTimingSMRate: the per-SM streaming rate of the three load
// forms on 1 .. all SMs, 1 MiB a block, beside a device-to-device copy.
func TestKernelTimingSMRate(t *testing.T) {
	needTiming(t)
	onGPU(t, func(c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand) {
		info := c.Info()
		if info.CCMajor < 9 {
			t.Skip("cp.async.bulk needs sm_90")
		}
		nv, err := cuda.LoadNVRTC()
		chk(err)
		ck, err := cuda.CompileModule(nv, info.CCMajor, info.CCMinor, smRateSource(), "sm_rate.cu", kernelOptions, cuda.DefaultKernelCache())
		chk(err)
		m, err := c.LoadModule("sm_rate", ck.Image)
		chk(err)
		fn := func(name string) *cuda.Function {
			f, err := c.Function(m, name)
			chk(err)
			return f
		}
		ldg, cpa, bulk := fn("sm_rate_ldg"), fn("sm_rate_cpa"), fn("sm_rate_bulk")
		// One block an SM: every launch asks for more than half an SM's
		// shared memory (the ldg kernel's is unused).
		const S, CH = 4, 32 << 10 // S: SR_CPA_S
		const smem = S * CH
		for _, f := range []*cuda.Function{ldg, cpa, bulk} {
			chk(c.SetMaxDynamicShared(f, smem))
		}
		const per = 1 << 20
		sms := info.SMs
		src := a.raw(int64(sms) * per)
		host := make([]byte, sms*per)
		for i := range host {
			host[i] = byte(r.Uint32())
		}
		chk(c.Upload(src, host))
		want := make([]uint32, sms)
		for b := range sms {
			for i := 0; i < per; i += 4 {
				want[b] ^= binary.LittleEndian.Uint32(host[b*per+i:])
			}
		}
		out := a.raw(int64(4 * sms))
		s := c.Stream()
		add := timingTable(t, c, a, r, int64(sms)*per, "sm rate: device-to-device copy", fmt.Sprintf("%d MiB", sms))
		type form struct {
			name string
			f    *cuda.Function
			args func() []any
		}
		forms := []form{
			{"ld.global 16 B, 16 in flight a thread", ldg, func() []any { return []any{src, int64(per), out} }},
			{fmt.Sprintf("cp.async 16 B, %d x %d KiB stages", S, CH>>10), cpa, func() []any { return []any{src, int64(per), out, CH} }},
			{fmt.Sprintf("cp.async.bulk, %d x %d KiB stages", S, CH>>10), bulk, func() []any { return []any{src, int64(per), out, S, CH} }},
		}
		if nv.Major < 12 {
			t.Logf("NVRTC %s: no cp.async.bulk form (PTX 8.0 needs NVRTC 12+)", nv.Version())
			forms = forms[:2]
		}
		for _, B := range []int{1, 4, 16, sms / 4, sms / 2, 3 * sms / 4, sms} {
			if B < 1 {
				continue
			}
			for _, fm := range forms {
				run := func() { chk(c.LaunchEx(fm.f, cuda.D1(B), cuda.D1(256), smem, s, false, fm.args()...)) }
				chk(c.MemsetD32(out, 0, int64(sms), s))
				run()
				chk(c.SyncStream(s))
				got := make([]uint32, B)
				chk(c.Download(got, out))
				for b := range B {
					if got[b] != want[b] {
						t.Fatalf("%s, %d blocks: block %d XOR %#x, want %#x: a stage was read before it landed or twice", fm.name, B, b, got[b], want[b])
					}
				}
				us := medianUs(c, s, 5, 11, run)
				add(fmt.Sprintf("sm rate: %s, %d SMs", fm.name, B), float64(B)*per, us,
					fmt.Sprintf("%.1f GB/s an SM", float64(per)/us/1e3))
			}
		}
	})
}
