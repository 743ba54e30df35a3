package gpu

import (
	"os"
	"strconv"
	"strings"

	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/cuda"
)

// o_proj is the first weight stream after the attention front, and the
// front's tail (the sparse MLA, its combine, absorb_v: ~20 us a DeepSeek-V3.2
// layer at 8192, 1 slot) reads ~20 MB where the HBM could move ~80. With
// TILERT_GPU_L2WARM set, a side chain forked once the query is ready reads a
// share of o_proj's weights (kernels.L2Warm: the first part of every period,
// so every o_proj block finds the same share in the L2) and o_proj waits for
// it; o_proj then streams that share from the L2. Session 4's L2 prefetch
// (prefetch instructions from extra blocks of the attention epilogue, so the
// critical chain's launch ended only when they had been issued) lost 1-7 us
// a layer; this one runs on its own stream at a rate its grid sets.
// Opt-in, not measured yet (NOT RUN): the bits are the same either way (it
// writes nothing).
//
// TILERT_GPU_L2WARM=PCT[,b=BLOCKS][,p=PERIOD]: PCT percent (1..100) of every
// PERIOD bytes (default 4096) of o_proj's weights, read by BLOCKS blocks of
// 256 threads (default: one an SM). Unset or 0: off.
type warmSpec struct {
	pct    int   // percent of every period; 0 off
	period int64 // bytes
	blocks int   // 0: one an SM
}

var warmSet, warmErr = parseWarm(os.Getenv("TILERT_GPU_L2WARM"))

func parseWarm(v string) (warmSpec, error) {
	w := warmSpec{period: 4096}
	if v == "" || v == "0" {
		return warmSpec{}, nil
	}
	bad := func(why string) (warmSpec, error) {
		return warmSpec{}, errors.WithHint(errors.Newf("TILERT_GPU_L2WARM=%q: %s", v, why),
			"set PCT[,b=BLOCKS][,p=PERIOD]: PCT percent (1..100) of every PERIOD bytes (a multiple of 16, default 4096) of o_proj read into the L2 by BLOCKS blocks (default one an SM), or unset it")
	}
	parts := strings.Split(v, ",")
	pct, err := strconv.Atoi(parts[0])
	if err != nil || pct < 1 || pct > 100 {
		return bad("the share is not a percent from 1 to 100")
	}
	w.pct = pct
	for _, p := range parts[1:] {
		k, val, ok := strings.Cut(p, "=")
		n, err := strconv.Atoi(val)
		switch {
		case !ok || err != nil:
			return bad("option " + strconv.Quote(p) + " is not KEY=NUMBER")
		case k == "b" && n >= 1 && n <= 65535:
			w.blocks = n
		case k == "p" && n >= 16 && n%16 == 0:
			w.period = int64(n)
		default:
			return bad("option " + strconv.Quote(p) + " is not b=1..65535 or p=a multiple of 16")
		}
	}
	if w.prefix() < 16 {
		return bad("the share of a period is less than 16 bytes")
	}
	return w, nil
}

// prefix is the bytes read of every period (whole 16-byte words).
func (w warmSpec) prefix() int64 { return w.period * int64(w.pct) / 100 / 16 * 16 }

// warmOProj forks o_proj's warm-up beside the attention's tail (nothing when
// off, or in a prefill chunk's GEMM).
// attnProjOut joins it before o_proj.
func (f *fwd) warmOProj(lw *dlayer) {
	o := f.o
	l := lw.O
	if warmSet.pct == 0 || l.w == 0 || useGemm(l, f.M) {
		return
	}
	o.do(o.b.fork(chainWarm, f.M))
	o.do(o.b.l2Warm(l.w, l.weightBytes(), warmSet.period, warmSet.prefix(), warmSet.blocks))
	o.do(o.b.unfork())
	f.warmed = true
}

// weightBytes is the size of l's weights (not its scales).
func (l dlin) weightBytes() int64 {
	esize := int64(1)
	switch l.kind {
	case linBF16:
		esize = 2
	case linF32:
		esize = 4
	}
	return int64(l.out) * int64(l.in) * esize
}

// l2Warm runs only on a forked side stream: on the main stream it would
// sit on the critical chain it is meant to stay beside.
func (b *cudaDevice) l2Warm(p cuda.DevPtr, n, period, prefix int64, blocks int) error {
	if b.forked() == nil {
		return nil
	}
	if blocks == 0 {
		blocks = b.c.Info().SMs
	}
	return b.k.L2Warm(b.s, p, n, period, prefix, blocks, 0)
}

// The emulator moves no bytes into a cache: nothing to do.
func (m *emuDevice) l2Warm(cuda.DevPtr, int64, int64, int64, int) error { return nil }

func (gb *graphDevice) l2Warm(p cuda.DevPtr, n, period, prefix int64, blocks int) error {
	return gb.rec("l2Warm", 0, func(b device) error { return b.l2Warm(p, n, period, prefix, blocks) },
		ku(p), uint64(n), uint64(period), uint64(prefix), ki(blocks))
}
