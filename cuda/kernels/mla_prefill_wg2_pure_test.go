package kernels

// mla_prefill_wg2 (cu/wg/mla_prefill_wg2.cu) without a GPU:
//   - its consumer warpgroups are mla_prefill_wg's code, line for line but
//     for the barriers (TestMLAPrefillWG2ConsumersAreWG), so
//     TestMLAPrefillWGTranscribed's model of their descriptors, fragments,
//     softmax and output covers them;
//   - its producer (mw2_fill) is transcribed lane by lane (wg2Fill) and
//     run inside wg's transcription in place of wg's conversion
//     (wgKnobs.wg2): the result must be wg's transcription bit for bit, in
//     h1's bounds, every stage byte written once, each quarter warp's
//     store 128 contiguous bytes, each warp load whole 32-byte sectors of
//     8 entries; planted producer mistakes fail;
//   - the two-stage handoff through named barriers is run as a model under
//     random schedules (TestMLAPrefillWG2Handoff): every valid tile
//     consumed once in order from the stage it was written to, no stage
//     rewritten while a consumer reads it, no barrier arrived at twice in
//     one phase, nothing pending at the end, no deadlock.
// What this does NOT check: the hardware (named-barrier semantics,
// setmaxnreg, the proxy fence); the GPU checks do (mla_prefill_wg2 beside
// mla_prefill_wg and mla_prefill_h1, bit for bit).

import (
	"math"
	"math/rand/v2"
	"regexp"
	"strings"
	"testing"

	"github.com/cockroachdb/errors"
)

// wg2SourceLines are the lines of mw2_fill and the block that wg2Fill and
// the handoff model transcribe.
var wg2SourceLines = []string{
	"const int q = NPW * (PB * b + u) + pw, j = 8 * (q & 7) + (lane & 7), c = 4 * (q >> 3) + (lane >> 3);",
	"for (int b = 0; b < 64 / NPW / PB; b++) {",
	"mw2_block<4, 8, MW2_PREG, MW2_CREG>(",
	"const u8* e = cache + (size_t)max(ts[u], 0) * MLA_TOK_BYTES;",
	"v[u] = __ldg((const uint4*)(e + 16 * c));",
	"sc[u] = __ldg((const float*)(e + MLA_LAT + 4 * (c >> 3)));",
	"mw2_put_lat(Kt, j, c, v[u], sc[u], ts[u]);",
	"const uint2 a = mw2_cvt4(v.x, m2, p2), bb = mw2_cvt4(v.y, m2, p2);",
	"const uint2 cc = mw2_cvt4(v.z, m2, p2), d = mw2_cvt4(v.w, m2, p2);",
	"*(uint4*)(Kt + MWG_OFF(j, 16 * c)) = ts >= 0 ? make_uint4(a.x, a.y, bb.x, bb.y) : z4;",
	"*(uint4*)(Kt + MWG_OFF(j, 16 * c + 8)) = ts >= 0 ? make_uint4(cc.x, cc.y, d.x, d.y) : z4;",
	"const int q = NPW * i + pw, j = 8 * (q & 7) + (lane & 7), r = 4 * (q >> 3) + (lane >> 3);",
	"for (int i = 0; i < 16 / NPW; i++) {",
	"rv[i] = __ldg((const uint4*)(cache + (size_t)max(rt[i], 0) * MLA_TOK_BYTES + 528 + 16 * r));",
	"mw2_put_rope(Kt, j, r, rv[i], rt + i);",
	"*(uint4*)(Kt + MWG_OFF(j, MLA_LAT + 8 * r)) = *ts >= 0 ? hv : z4;",
	"return make_uint2(mwg_hmul2(mwg_hmul2(mwg_e4m3x2(b), m2), p2), mwg_hmul2(mwg_hmul2(mwg_e4m3x2(b >> 16), m2), p2));",
	// The handoff (TestMLAPrefillWG2Handoff's model).
	"if (!mw2_bar_or<MW2_BAR_P, 32 * NPW>(slot >= 0)) continue;",
	"constexpr int NT = 256 + 32 * NPW;  // the block's threads (FULL / EMPTY count)",
	"if (n >= 2) mw2_bar_sync_st<MW2_BAR_EMPTY, NT>(st);  // the consumers are done with handoff n - 2",
	"mw2_fill<NPW, PB>(Kt0 + st * MWG_TILE_BYTES, cache, sls, pw, lane);",
	"mw2_bar_arrive_st<MW2_BAR_FULL, NT>(st);",
	"if (pt == 0) done[st] = 1;",
	"if (n >= 1) mw2_bar_sync_st<MW2_BAR_EMPTY, NT>(((n - 1) & 1));  // the last tile's release",
	"mw2_bar_sync_st<MW2_BAR_FULL, NT>(st);  // stage st is filled (or done)",
	"if (done[st]) break;",
	"mw2_bar_arrive_st<MW2_BAR_EMPTY, NT>(st);  // this warpgroup is done with stage st",
	"const u32 kt_a = kt_a0 + (u32)st * (u32)MWG_TILE_BYTES;",
	"#define MW2_PREG 120",
	"#define MW2_CREG 192",
	"extern \"C\" __global__ void __launch_bounds__(384, 1) mla_prefill_wg2(MT_ARGS) {",
}

// wg2Fill is mw2_fill for the 128 producer threads on the stage at
// wgOffKt of m, from the cache image (global memory). bad plants a
// mistake: 1 the scale group of chunk c taken as c/4, 2 the RoPE chunk's
// row and chunk roles of the lane swapped, 3 the second 8 latent dims of a
// chunk taken from its first 8 bytes, 4 the latent chunk's row from lane/4.
func wg2Fill(t testing.TB, m h1Smem, cache []byte, sls *[64]int32, bad int) {
	var writes [72 * 8 * 128]uint8
	store16 := func(dst int, v [8]uint16) {
		for e := range 8 {
			m.setH(wgOffKt+dst+2*e, v[e])
			writes[dst+2*e]++
			writes[dst+2*e+1]++
		}
	}
	h16 := func(addr int) uint16 { return uint16(cache[addr]) | uint16(cache[addr+1])<<8 }
	type lanes struct{ st, ld [32]int }
	var quarter [64]lanes // per latent (i, pw): the warp's store and load addresses (checked below)
	for pt := range 128 {
		pw, lane := pt>>5, pt&31
		for b := range 2 {
			for u := range 8 {
				q, i := 4*(8*b+u)+pw, 8*b+u
				j, c := 8*(q&7)+(lane&7), 4*(q>>3)+(lane>>3)
				if bad == 4 {
					j = 8*(q&7) + (lane >> 2)
				}
				ts := sls[j]
				e := int(max(ts, 0)) * MLATokenBytes
				grp := c >> 3
				if bad == 1 {
					grp = c >> 2 & 3
				}
				sc := getF32(cache[e+512+4*grp:])
				for half := range 2 {
					var hv [8]uint16
					src := e + 16*c + 8*half
					if bad == 3 {
						src = e + 16*c
					}
					for k := range 8 {
						if ts >= 0 {
							hv[k] = h1Bits(h1Latent(cache[src+k], sc))
						}
					}
					store16(mwgOff(j, 16*c+8*half), hv)
				}
				quarter[4*i+pw].st[lane] = mwgOff(j, 16*c)
				quarter[4*i+pw].ld[lane] = e + 16*c
			}
		}
		for i := range 4 {
			q := 4*i + pw
			j, r := 8*(q&7)+(lane&7), 4*(q>>3)+(lane>>3)
			if bad == 2 {
				j, r = 8*(q&7)+(lane>>2), lane&7
			}
			ts := sls[j]
			e := int(max(ts, 0))*MLATokenBytes + 528 + 16*r
			var hv [8]uint16
			for k := range 8 {
				if ts >= 0 {
					hv[k] = h1Bits(h1Round(bf16ToF64(h16(e + 2*k))))
				}
			}
			store16(mwgOff(j, 512+8*r), hv)
		}
	}
	if bad != 0 {
		return
	}
	for i, n := range writes {
		if n != 1 {
			t.Fatalf("stage byte %d written %d times", i, n)
		}
	}
	for _, ql := range quarter {
		st, ld := ql.st, ql.ld
		for qw := range 4 { // a quarter warp's 16-byte stores: 128 contiguous bytes (no bank conflict)
			lo := st[8*qw]
			for l := 8 * qw; l < 8*qw+8; l++ {
				lo = min(lo, st[l])
			}
			seen := map[int]bool{}
			for l := 8 * qw; l < 8*qw+8; l++ {
				if d := st[l] - lo; d%16 != 0 || d >= 128 || seen[d] {
					t.Fatalf("quarter warp %d stores at %v: not 128 contiguous bytes", qw, st[8*qw:8*qw+8])
				} else {
					seen[d] = true
				}
			}
		}
		// The warp's loads: lanes l and l+8, l+16, l+24 read 4 consecutive
		// chunks of one entry (64 contiguous bytes).
		for l := range 8 {
			if sls[0] >= 0 && (ld[l+8] != ld[l]+16 || ld[l+16] != ld[l]+32 || ld[l+24] != ld[l]+48) {
				t.Fatalf("lane %d's loads not 64 contiguous bytes of one entry: %d %d %d %d", l, ld[l], ld[l+8], ld[l+16], ld[l+24])
			}
		}
	}
}

// The consumer warpgroups' code is mla_prefill_wg's: the queries, the
// per-tile body (QK^T, softmax, P, P.V) and the epilogue are the same
// lines, __syncthreads() replaced by the consumers' named barrier.
func TestMLAPrefillWG2ConsumersAreWG(t *testing.T) {
	src := WGKernelSource()
	i2 := strings.Index(src, "__device__ __forceinline__ void mw2_block(MT_ARGS, const long long* __restrict__ row_base = nullptr) {")
	if i2 < 0 || !strings.Contains(src[i2:], "mla_prefill_wg2(MT_ARGS) {") {
		t.Fatal("mla_prefill_wg2 (mw2_block) not in the sm_90a module")
	}
	wg, wg2 := src[:i2], src[i2:]
	// mla_decode_wg2's split partials (DEC only: the prefill kernel's
	// gridDim.x is 1) leave the epilogue before wg's lines.
	if i, j := strings.Index(wg2, "if (DEC && gridDim.x > 1) {"), strings.Index(wg2, "    return;\n  }\n  if (lse && th == 0"); i < 0 || j < i {
		t.Fatal("mw2_block's split partials (DEC) not found before the epilogue")
	} else {
		wg2 = wg2[:i] + wg2[j+len("    return;\n  }\n"):]
	}
	// mla_decode_wg2b's query rounds (V & 1) as mw2_block reads at V = 0
	// (mla_prefill_wg2, mla_decode_wg2): two heads a round.
	wg2 = strings.NewReplacer("constexpr int QR = (V & 1) ? 4 : 2;", "", "hp += QR", "hp += 2", "v[QR]", "v[2]", "r < QR", "r < 2").Replace(wg2)
	// mla_decode_wg2h's head masks (V & 8) as mw2_block reads them without
	// it (HPB == MWG_HB: always true / false, compiled out).
	wg2 = strings.NewReplacer("if (h < H && (HPB == MWG_HB || 8 * w + hp + r < HPB)) {", "if (h < H) {",
		"if (h < H && (HPB == MWG_HB || hb < HPB)) lse", "if (h < H) lse",
		"if (h >= H || (HPB < MWG_HB && hb >= HPB)) continue;", "if (h >= H) continue;").Replace(wg2)
	norm := func(s string) string {
		s = strings.ReplaceAll(s, "mw2_bar_sync<MW2_BAR_C, 256>();", "__syncthreads();")
		s = regexp.MustCompile(`//[^\n]*`).ReplaceAllString(s, "")
		return strings.Join(strings.Fields(s), " ")
	}
	span := func(s, from, to string, nth int) string {
		i := strings.Index(s, from)
		if i < 0 {
			t.Fatalf("%q not found", from)
		}
		j := i
		for range nth {
			k := strings.Index(s[j+1:], to)
			if k < 0 {
				t.Fatalf("%q not found after %q", to, from)
			}
			j += 1 + k
		}
		return s[i : j+len(to)]
	}
	for _, c := range []struct {
		name, from, to string
		nth            int
	}{
		{"queries", "for (int hp = 0; hp < 8; hp += 2) {", "mwg_f16x2(v[r][i].z * f, v[r][i].w * f));", 1},
		{"QK^T, softmax, P.V", "// S[64 heads][32 tokens of this warpgroup] over 576 dims.", "mwg_pin<128>(o);", 2},
		{"epilogue", "l0 += __shfl_xor_sync(0xffffffffu, l0, 1);", "o[4 * i + 2 * hr + 1] * inv);", 1},
	} {
		a, b := norm(span(wg, c.from, c.to, c.nth)), norm(span(wg2, c.from, c.to, c.nth))
		if a != b {
			t.Errorf("%s: mla_prefill_wg2's consumers differ from mla_prefill_wg:\nwg:  %s\nwg2: %s", c.name, a, b)
		} else {
			t.Logf("%s: the same %d characters", c.name, len(a))
		}
	}
	// The tile bases: wg's kt_a is its one tile, wg2's the stage's.
	for _, l := range []string{
		"const u32 qk_b0 = kt_a + (u32)(4 * th) * 128u;",
		"const u32 pv_b0 = kt_a + (u32)(32 * th * 8) * 128u;",
		"const u32 qk_a0 = qs_a;",
	} {
		if !strings.Contains(wg2, l) {
			t.Errorf("mla_prefill_wg2 lacks %q", l)
		}
	}
}

// TestMLAPrefillWG2Transcribed: wg's transcription with wg2's producer
// writing the tiles is wg's transcription bit for bit (so in h1's bounds);
// planted producer mistakes fail the bounds.
func TestMLAPrefillWG2Transcribed(t *testing.T) {
	src := WGKernelSource()
	for _, l := range wg2SourceLines {
		if !strings.Contains(src, l) {
			t.Errorf("transcribed line no longer in cu/wg/mla_prefill_wg2.cu: %s", l)
		}
	}
	if MLAPrefillWG2SmemBytes != 231432 || MLAPrefillWG2SmemBytes > 232448 || !strings.Contains(src, "flags 8 = 231,432 bytes.") {
		t.Errorf("shared memory: MLAPrefillWG2SmemBytes %d, want 231,432 (MW2_SMEM_BYTES) <= 232,448", MLAPrefillWG2SmemBytes)
	}
	r := rand.New(rand.NewPCG(17, 3))
	for _, cs := range []struct{ nq, H, nidx, ldIdx int }{{4, 72, 150, 160}, {3, 4, 32, 32}, {2, 128, 300, 304}, {4, 4, 512, 512}} {
		c := newH1Case(r, cs.nq, cs.H, cs.nidx, cs.ldIdx, 0.1)
		if cs.nidx == 512 {
			// The GPU check's holes: odd rows' tiles 1-2 empty, tile 3 full.
			for qi := 1; qi < cs.nq; qi += 2 {
				for j := 64; j < 192; j++ {
					c.idx[qi*cs.ldIdx+j] = -1
				}
				for j := 192; j < 256; j++ {
					c.idx[qi*cs.ldIdx+j] = int32(r.IntN(int(c.lens[qi])))
				}
			}
		}
		wo, wl := wgTranscribe(t, c, wgKnobs{})
		out, lse := wgTranscribe(t, c, wgKnobs{wg2: true})
		diff := 0
		for i := range out {
			if math.Float32bits(out[i]) != math.Float32bits(wo[i]) {
				diff++
			}
		}
		for i := range lse {
			if math.Float32bits(lse[i]) != math.Float32bits(wl[i]) {
				diff++
			}
		}
		we, wh, wlb, _ := c.check(out, lse)
		t.Logf("nq=%d H=%d nidx=%d: %d values differ from wg's transcription; |d|/bound exact %.3g, emulated %.3g, lse %.3g", cs.nq, cs.H, cs.nidx, diff, we, wh, wlb)
		if diff != 0 {
			t.Errorf("nq=%d H=%d: wg2's producer gives %d values other than wg's conversion", cs.nq, cs.H, diff)
		}
		if !(we <= 1 && wh <= 1 && wlb <= 1) {
			t.Errorf("nq=%d H=%d: outside the bounds: exact %g emulated %g lse %g", cs.nq, cs.H, we, wh, wlb)
		}
		if cs.H != 72 {
			continue
		}
		for bad, name := range map[int]string{1: "scale group c/4", 2: "RoPE row/chunk roles swapped", 3: "second half of a chunk from its first 8 bytes", 4: "latent row from lane/4"} {
			o3, l3 := wgTranscribe(t, c, wgKnobs{wg2: true, wg2Bad: bad})
			if _, wh3, _, _ := c.check(o3, l3); wh3 <= 1 {
				t.Errorf("planted producer mistake %q passes the emulated bound (%g)", name, wh3)
			} else {
				t.Logf("planted producer mistake %q: emulated |d|/bound %.3g", name, wh3)
			}
		}
	}
}

// The handoff of mla_prefill_wg2 as a model: the producer and the two
// consumer warpgroups (128 threads each) step in a random order through
// their barrier operations (bar.arrive: add and go on; bar.sync /
// bar.red: add and wait for the barrier's 384 (FULL, EMPTY) or 128 (P);
// a barrier completes, releases its waiters and resets when its count is
// reached). Checked: each valid tile is read by both consumers, in order,
// from the stage the producer wrote it to and not rewritten while read;
// no party arrives twice at one barrier phase; nothing pending at the end.
func TestMLAPrefillWG2Handoff(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 8))
	patterns := [][]bool{{}, {false}, {true}, {true, true}, {false, true, false}, {true, false, true, true}, {true, true, true, true, true}}
	for range 20 {
		v := make([]bool, 1+r.IntN(12))
		for i := range v {
			v[i] = r.IntN(4) != 0
		}
		patterns = append(patterns, v)
	}
	for _, valid := range patterns {
		for trial := range 200 {
			if err := wg2Handoff(valid, 0, r); err != nil {
				t.Fatalf("pattern %v trial %d: %v", valid, trial, err)
			}
		}
	}
	// Planted mistakes: each must be caught under some schedule.
	for bad, name := range map[int]string{1: "no wait for the last tile's release", 2: "no wait before refilling a stage", 3: "done written to the other stage"} {
		caught := 0
		for range 200 {
			if err := wg2Handoff([]bool{true, true, true, false, true}, bad, r); err != nil {
				caught++
			}
		}
		if caught == 0 {
			t.Errorf("planted handoff mistake %q never caught", name)
		} else {
			t.Logf("planted handoff mistake %q caught in %d of 200 schedules", name, caught)
		}
	}
}

// wg2Handoff runs the model once on a random schedule; bad plants a
// mistake in the producer (1 no final release wait, 2 no EMPTY wait
// before reuse, 3 the done flag in the wrong stage).
func wg2Handoff(valid []bool, bad int, r *rand.Rand) error {
	type op struct {
		kind string // "sync", "arrive", "write", "read", "release"
		bar  int    // FULL 3/4, EMPTY 5/6 (as MW2_BAR_FULL + st, MW2_BAR_EMPTY + st)
		st   int
		n    int // handoff index; -1 done
	}
	producer := func(valid []bool) []op {
		var p []op
		n := 0
		for _, v := range valid {
			if !v {
				continue
			}
			st := n & 1
			if n >= 2 && bad != 2 {
				p = append(p, op{kind: "sync", bar: 5 + st})
			}
			p = append(p, op{kind: "write", st: st, n: n}, op{kind: "arrive", bar: 3 + st})
			n++
		}
		st := n & 1
		if n >= 2 {
			p = append(p, op{kind: "sync", bar: 5 + st})
		}
		if bad == 3 {
			p = append(p, op{kind: "write", st: st ^ 1, n: -1}, op{kind: "arrive", bar: 3 + st})
		} else {
			p = append(p, op{kind: "write", st: st, n: -1}, op{kind: "arrive", bar: 3 + st})
		}
		if n >= 1 && bad != 1 {
			p = append(p, op{kind: "sync", bar: 5 + ((n - 1) & 1)})
		}
		return p
	}
	nValid := 0
	for _, v := range valid {
		if v {
			nValid++
		}
	}
	{
		{
			prog := [3][]op{producer(valid)}
			// Consumers are generated lazily (their loop depends on the stage).
			pc := [3]int{}
			cons := [3]int{0, 0, 0} // consumer's handoff counter k
			ended := [3]bool{}
			var stage [2]int // handoff index held; -2 never written
			stage[0], stage[1] = -2, -2
			reading := [2][3]bool{}
			var count [8]int       // arrivals (threads) of the current phase
			var arrived [8][3]bool // who arrived this phase
			var gen [8]int         // completed phases
			waiting := [3]int{-1, -1, -1}
			waitGen := [3]int{}
			need := func(bar int) int { return 384 }
			weight := [3]int{128, 128, 128}
			var got [3][]int
			var simErr error
			arrive := func(who, bar int) bool {
				if arrived[bar][who] && simErr == nil {
					simErr = errors.Newf("party %d arrived twice at barrier %d in one phase", who, bar)
				}
				arrived[bar][who] = true
				count[bar] += weight[who]
				if count[bar] == need(bar) {
					count[bar] = 0
					arrived[bar] = [3]bool{}
					gen[bar]++
					return true
				}
				return false
			}
			next := func(who int) (op, bool) {
				if who == 0 {
					if pc[0] < len(prog[0]) {
						return prog[0][pc[0]], true
					}
					return op{}, false
				}
				// consumer who: sync FULL[k&1], read, (done: end) release, arrive EMPTY[k&1]
				k := cons[who]
				switch pc[who] {
				case 0:
					return op{kind: "sync", bar: 3 + k&1}, true
				case 1:
					return op{kind: "read", st: k & 1, n: k}, true
				case 2:
					return op{kind: "release", st: k & 1}, true
				default:
					return op{kind: "arrive", bar: 5 + k&1}, true
				}
			}
			for steps := 0; ; steps++ {
				if steps > 100000 {
					return errors.New("no progress")
				}
				var runnable []int
				for who := range 3 {
					if ended[who] {
						continue
					}
					if waiting[who] >= 0 {
						if gen[waiting[who]] > waitGen[who] {
							waiting[who] = -1
						} else {
							continue
						}
					}
					runnable = append(runnable, who)
				}
				if len(runnable) == 0 {
					if ended[0] && ended[1] && ended[2] {
						break
					}
					return errors.Newf("deadlock (waiting %v, counts %v)", waiting, count)
				}
				who := runnable[r.IntN(len(runnable))]
				o, ok := next(who)
				if !ok {
					ended[who] = true
					continue
				}
				switch o.kind {
				case "sync":
					waitGen[who] = gen[o.bar]
					if !arrive(who, o.bar) {
						waiting[who] = o.bar
					}
				case "arrive":
					arrive(who, o.bar)
				case "write":
					if reading[o.st][1] || reading[o.st][2] {
						return errors.Newf("stage %d rewritten while a consumer reads it", o.st)
					}
					stage[o.st] = o.n
				case "read":
					if stage[o.st] == -1 {
						ended[who] = true
						continue
					}
					if stage[o.st] != o.n {
						return errors.Newf("consumer %d read handoff %d from stage %d holding %d", who, o.n, o.st, stage[o.st])
					}
					reading[o.st][who] = true
					got[who] = append(got[who], o.n)
				case "release":
					reading[o.st][who] = false
				}
				if simErr != nil {
					return simErr
				}
				if who == 0 {
					pc[0]++
				} else if !ended[who] {
					pc[who]++
					if pc[who] == 4 {
						pc[who] = 0
						cons[who]++
					}
				}
			}
			for b := range 8 {
				if count[b] != 0 {
					return errors.Newf("barrier %d left with %d arrivals", b, count[b])
				}
			}
			for who := 1; who < 3; who++ {
				if len(got[who]) != nValid {
					return errors.Newf("consumer %d read %v, want %d tiles", who, got[who], nValid)
				}
				for i, n := range got[who] {
					if n != i {
						return errors.Newf("consumer %d read %v", who, got[who])
					}
				}
			}
		}
	}
	return nil
}

// TestUseWG2B pins where MLADecodeWG2 launches mla_decode_wg2b: one-tile
// blocks of at most one row of 128 heads (session 21: slower in the step at
// 128 blocks, GLM-5's 4 slots and the DeepSeek-V3.2 MTP step).
// TestWG2HKernel: mla_decode_wg2h (32 heads a block) takes one-tile
// launches of at most four rows x head blocks, only with MLAHeadsPerBlock
// 32 (and MLAWG2B) on, and by default (0) on one row of 64 heads; 16
// (mla_decode_wg2q, removed after session 38) and other values take none.
func TestWG2HKernel(t *testing.T) {
	for _, c := range []struct {
		hpb, nq, H, tps int
		b               bool
		want            string
	}{
		{32, 1, 128, 64, true, "mla_decode_wg2h"}, {32, 1, 64, 64, true, "mla_decode_wg2h"}, {32, 2, 64, 64, true, "mla_decode_wg2h"},
		{32, 1, 48, 64, true, "mla_decode_wg2h"}, {32, 4, 32, 64, true, "mla_decode_wg2h"},
		{32, 2, 128, 64, true, ""}, {32, 3, 64, 64, true, ""}, {32, 1, 160, 64, true, ""},
		{32, 1, 128, 128, true, ""}, {0, 1, 128, 64, true, ""}, {64, 1, 128, 64, true, ""}, {32, 1, 128, 64, false, ""},
		{16, 1, 64, 64, true, ""}, {16, 2, 32, 64, true, ""}, {16, 1, 128, 64, true, ""}, {8, 1, 32, 64, true, ""},
		// 0, the default: 32 for one row of 64 heads only; 64: none.
		{0, 1, 64, 64, true, "mla_decode_wg2h"}, {0, 2, 64, 64, true, ""}, {0, 1, 32, 64, true, ""}, {0, 1, 64, 128, true, ""},
		{0, 1, 64, 64, false, ""}, {64, 1, 64, 64, true, ""},
	} {
		withWG2B(c.b, func() {
			withHeadsPerBlock(c.hpb, func() {
				got, h := wg2hKernel(c.nq, c.H, c.tps)
				wantH := c.hpb
				if wantH == 0 {
					wantH = 32
				}
				if got != c.want || (got != "" && h != wantH) {
					t.Errorf("wg2hKernel(nq=%d, H=%d, tps=%d) MLAHeadsPerBlock=%d MLAWG2B=%v = %q, %d; want %q", c.nq, c.H, c.tps, c.hpb, c.b, got, h, c.want)
				}
			})
		})
	}
	// The kernel is in the module, on the sm_90a guard's both sides;
	// mla_decode_wg2q is gone.
	for name, want := range map[string]int{"mla_decode_wg2h": 2, "mla_decode_wg2q": 0} {
		if n := strings.Count(WGKernelSource(), name+"(MT_ARGS"); n != want {
			t.Errorf("%s declared %d times in the wg module, want %d", name, n, want)
		}
	}
}

func TestUseWG2B(t *testing.T) {
	for _, c := range []struct {
		nq, H, tps int
		on, want   bool
	}{
		{1, 128, 64, true, true}, {1, 64, 64, true, true}, {2, 64, 64, true, true},
		{2, 128, 64, true, false}, {4, 64, 64, true, false}, {4, 128, 64, true, false},
		{1, 128, 128, true, false}, {1, 128, 64, false, false},
	} {
		withWG2B(c.on, func() {
			if got := useWG2B(c.nq, c.H, c.tps); got != c.want {
				t.Errorf("useWG2B(nq=%d, H=%d, tps=%d) with MLAWG2B=%v = %v, want %v", c.nq, c.H, c.tps, c.on, got, c.want)
			}
		})
	}
}
