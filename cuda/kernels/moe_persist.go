package kernels

import (
	"embed"
	"io/fs"
	"log/slog"
	"os"
	"sort"
	"strings"
	"sync"

	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/cuda"
)

// The persistent MoE kernel (cu/persist/moe_persist.cu; TILERT_GPU_MOE_PERSIST=1
// in the engine): the MoE half of a decode layer for one input row as one
// launch of co-resident blocks with device-wide barriers between its
// phases (post-attention norm + router + shared gate/up, routing + routed
// gate/up + shared down, routed down, combine + residual + next norm). Its
// own module (common.cuh, moe.cu for the routing, then cu/persist/*.cu),
// compiled on first use: the default module's source stays as it is.

//go:embed cu/persist/*.cu
var persistFS embed.FS

// PersistKernelSource is the persistent module's source.
func PersistKernelSource() string {
	var b strings.Builder
	for _, n := range []string{"cu/common.cuh", "cu/moe.cu"} {
		src, err := kernelFS.ReadFile(n)
		if err != nil {
			panic(err) // embedded at build time
		}
		b.WriteString("#line 1 \"" + strings.TrimPrefix(n, "cu/") + "\"\n")
		b.Write(src)
		b.WriteString("\n")
	}
	names, err := fs.Glob(persistFS, "cu/persist/*.cu")
	if err != nil {
		panic(err)
	}
	sort.Strings(names)
	for _, n := range names {
		src, err := persistFS.ReadFile(n)
		if err != nil {
			panic(err)
		}
		b.WriteString("#line 1 \"" + strings.TrimPrefix(n, "cu/") + "\"\n")
		b.Write(src)
		b.WriteString("\n")
	}
	return b.String()
}

// CompilePersist compiles the persistent module as Compile does the default one.
func CompilePersist(nv *cuda.NVRTC, major, minor int, cache cuda.KernelCache) (*cuda.Compiled, error) {
	return cuda.CompileModule(nv, major, minor, PersistKernelSource(), "tilert_kernels_persist.cu", kernelOptions, cache)
}

var persistModule = &extraModule{
	name: "tilert_kernels_persist",
	compile: func(nv *cuda.NVRTC, i cuda.DeviceInfo) (*cuda.Compiled, error) {
		return CompilePersist(nv, i.CCMajor, i.CCMinor, cuda.DefaultKernelCache())
	},
}

// persist loads the persistent module in k's context on first use (a
// failure is kept, not retried).
func (k *Set) persist() (*cuda.Module, error) { return persistModule.load(k) }

// moePersistVariant is one compiled shape of the kernel (the same sums:
// they depend on the chain's group sizes only): its name and the blocks an
// SM its __launch_bounds__ promise (the grid is that many per SM).
type moePersistVariant struct {
	name string
	bps  int
}

// moePersistVariants: "" (8 tile rows a group, 8 loads in flight a thread,
// 2 blocks an SM), "d16" (4 rows, 16 loads, 2 blocks), "b3" (4 rows, 8
// loads, 3 blocks); TILERT_GPU_MOE_PERSIST_V picks one (the timing test
// times them all).
var moePersistVariants = map[string]moePersistVariant{
	"":    {"moe_persist_m1", 2},
	"d16": {"moe_persist_m1_d16", 2},
	"b3":  {"moe_persist_m1_b3", 3},
}

// MoEPersistVariant is the variant MoEPersist launches (a variable so
// tests can run each).
var MoEPersistVariant = os.Getenv("TILERT_GPU_MOE_PERSIST_V")

const (
	moePersistThreads = 256
	// MoEPersistMaxH is MP_MAXH: the hidden row held in shared memory.
	MoEPersistMaxH = 8192
	// moePersistMaxK is MP_MAXK: the routed slots the combine loads at once.
	moePersistMaxK = 16
	// moePersistSmem bounds a block's static shared memory (40576 bytes,
	// nvcc -Xptxas -v; cuda/kernels/NOTES.md): 3 blocks an SM fit in an
	// H100/H200 SM's 228 KB.
	moePersistSmem = 41 << 10
	// MoEPersistCtlBytes is the control buffer a launch needs: the barrier's
	// two counters and the norm's partial sums (zeroed once when allocated,
	// then left as the kernel leaves it).
	MoEPersistCtlBytes = 256
)

// MoEPersistArgs is one row's MoE half (M = 1). Pointers are device
// pointers; 0 where optional.
type MoEPersistArgs struct {
	// X is the residual row (read; left as x + B + moe). B, when set, is
	// added to it first (o_proj's output; 0: already added). PostNorm is the
	// post-attention RMSNorm's weights; H receives that norm's row.
	X, B, PostNorm, H cuda.DevPtr
	Eps               float32
	// Router: bf16 [E][Hidden]; RLog [E] receives its logits; Bias the
	// routing's correction bias (may be 0); Idx/Wts [K] receive the choice.
	Router, RLog, Bias, Idx, Wts cuda.DevPtr
	E, K, NGroup, TopKGroup      int
	NormTopK                     bool
	Scale                        float32
	// Expert tables (device arrays of per-expert pointers, fp8 weights
	// [MI][Hidden] for gate/up, [Hidden][MI] for down, and their scales).
	TGate, TGateS, TUp, TUpS, TDown, TDownS cuda.DevPtr
	// The shared expert (fp8, the routed experts' shape); all 0: none.
	ShGate, ShGateS, ShUp, ShUpS, ShDown, ShDownS cuda.DevPtr
	// EG [K+1][MI] and EY [K+1][Hidden] are scratch (left as the chain
	// of launches leaves them).
	EG, EY        cuda.DevPtr
	Hidden, Inter int
	// Y, when set, receives rmsnorm(x) * NextNorm (the next layer's input);
	// 0: the norm is left to the next layer (moe_combine_slots_res).
	Y, NextNorm cuda.DevPtr
	// Ctl is MoEPersistCtlBytes of device memory, zeroed once.
	Ctl cuda.DevPtr
	// Mo, when set, receives the combine alone (moe_combine_slots: the
	// shared expert plus the weighted routed slots) and X is read as the
	// normed row itself (PostNorm, B, H, Y must be 0): the tensor-parallel
	// shard's MoE, whose norms ride in its all-reduce.
	Mo cuda.DevPtr
}

// MoEPersistPlan is the host-side shape of a launch: group sizes of the
// tile arithmetic (the chain's, so the same bits), router rows per task,
// norm threads and the grid.
type MoEPersistPlan struct {
	Ggu, Gd, RR, NT, Grid int
}

// moePersistPlan computes the plan for sms SMs (pure; tests run it here).
func moePersistPlan(sms, E, K, H, MI int, shared bool) MoEPersistPlan {
	return moePersistPlanB(sms, E, K, H, MI, shared, 2)
}

// moePersistPlanB is moePersistPlan for bps blocks an SM.
func moePersistPlanB(sms, E, K, H, MI int, shared bool, bps int) MoEPersistPlan {
	nslots := K
	if shared {
		nslots++
	}
	ggu, _ := tileShape(sms, MI, H, 1, nslots, true)
	gd, _ := tileShape(sms, H, MI, 1, nslots, false)
	return MoEPersistPlan{Ggu: ggu, Gd: gd, RR: gemvWideRowsFor(sms, E, H*2, 1), NT: normThreads(H),
		Grid: max(1, sms) * bps}
}

// MoEPersistShapeOK says whether the kernel takes the dimensions (the
// engine checks it before choosing the persistent path).
func MoEPersistShapeOK(E, K, H, MI int) error {
	switch {
	case H <= 0 || H > MoEPersistMaxH || H%16 != 0:
		return errors.Newf("moe persist: hidden %d (needs a multiple of 16 up to %d)", H, MoEPersistMaxH)
	case MI <= 0 || MI%16 != 0:
		return errors.Newf("moe persist: intermediate %d (needs a multiple of 16)", MI)
	case E <= 0 || E > moePersistThreads:
		return errors.Newf("moe persist: %d experts (at most %d)", E, moePersistThreads)
	case K <= 0 || K > min(E, maxRouteTopK, moePersistMaxK):
		return errors.Newf("moe persist: top-k %d of %d experts", K, E)
	case cdiv(H, normThreads(H)) > normRegs:
		return errors.Newf("moe persist: hidden %d is past the register norm's %d elements a thread", H, normRegs)
	}
	return nil
}

// MoEPersist runs a's MoE half in one launch (see moe_persist.cu): every
// output (H, RLog, Idx, Wts, EG, EY, X, Y) is bit for bit what the default
// chain of launches writes at one row (AddRMSNorm or RMSNorm, GemvBF16Wide,
// MoERoute, ExpertsFP8 twice, MoECombineSlots, AddRMSNorm; or
// MoECombineSlotsRes without Y).
func (k *Set) MoEPersist(s cuda.Stream, a MoEPersistArgs) error {
	if err := MoEPersistShapeOK(a.E, a.K, a.Hidden, a.Inter); err != nil {
		return err
	}
	if a.NGroup > maxRouteGroups || (a.NGroup > 1 && (a.E%a.NGroup != 0 || a.TopKGroup <= 0)) {
		return errors.Newf("moe persist: E=%d in %d groups, topk_group %d", a.E, a.NGroup, a.TopKGroup)
	}
	if a.Mo != 0 && (a.PostNorm != 0 || a.B != 0 || a.H != 0 || a.Y != 0) {
		return errors.Newf("moe persist: the combine-only form (mo) takes the normed row in x, no norms, b, h or y")
	}
	if a.Mo == 0 && (a.PostNorm == 0 || a.H == 0) {
		return errors.Newf("moe persist: no post-attention norm weights or h (needed unless mo is set)")
	}
	for _, p := range []struct {
		name string
		v    cuda.DevPtr
	}{{"x", a.X}, {"router", a.Router}, {"rlog", a.RLog}, {"idx", a.Idx},
		{"wts", a.Wts}, {"gate table", a.TGate}, {"up table", a.TUp}, {"down table", a.TDown}, {"eg", a.EG},
		{"ey", a.EY}, {"ctl", a.Ctl}} {
		if p.v == 0 {
			return errors.Newf("moe persist: no %s pointer", p.name)
		}
	}
	if (a.Y == 0) != (a.NextNorm == 0) {
		return errors.Newf("moe persist: the next norm needs both y and its weights (y=%#x w=%#x)", uint64(a.Y), uint64(a.NextNorm))
	}
	shared := a.ShGate != 0
	if shared && (a.ShUp == 0 || a.ShDown == 0) || !shared && (a.ShUp != 0 || a.ShDown != 0) {
		return errors.Newf("moe persist: the shared expert needs gate, up and down weights")
	}
	for _, p := range []cuda.DevPtr{a.X, a.B, a.H, a.Router, a.ShGate, a.ShUp, a.ShDown, a.EG, a.EY} {
		if uint64(p)%16 != 0 {
			return errors.Newf("moe persist: pointer %#x is not 16-byte aligned", uint64(p))
		}
	}
	if a.Mo != 0 && a.Mo == a.X {
		return errors.Newf("moe persist: mo must not alias x")
	}
	if a.Y != 0 && (a.Y == a.X || a.Y == a.B) {
		return errors.Newf("moe persist: y must not alias x or b")
	}
	mod, err := k.persist()
	if err != nil {
		return errors.Wrap(err, "moe persist: loading its module")
	}
	v, ok := moePersistVariants[MoEPersistVariant]
	if !ok {
		return errors.Newf("moe persist: TILERT_GPU_MOE_PERSIST_V=%q (want unset, d16 or b3)", MoEPersistVariant)
	}
	f, err := k.c.Function(mod, v.name)
	if err != nil {
		return err
	}
	bps, err := k.moePersistBPS(f, v.bps)
	if err != nil {
		return err
	}
	pl := moePersistPlanB(k.c.Info().SMs, a.E, a.K, a.Hidden, a.Inter, shared, bps)
	if pl.Grid < pl.NT/32 {
		return errors.Newf("moe persist: grid %d below the norm's %d blocks", pl.Grid, pl.NT/32)
	}
	return k.c.LaunchEx(f, cuda.D1(pl.Grid), cuda.D1(moePersistThreads), 0, s, false, moePersistLaunchArgs(a, pl)...)
}

// moePersistLaunchArgs is the kernel's argument list, in its signature's
// order (TestMoEPersistLaunchArgs compares them with the source).
func moePersistLaunchArgs(a MoEPersistArgs, pl MoEPersistPlan) []any {
	bar, npart := a.Ctl, a.Ctl.Add(64)
	return []any{
		a.X, a.B, a.PostNorm, a.H, a.Eps,
		a.Router, a.RLog, a.Bias, a.Idx, a.Wts,
		a.E, a.K, a.NGroup, a.TopKGroup, b2i(a.NormTopK), a.Scale, pl.RR,
		a.TGate, a.TGateS, a.TUp, a.TUpS, a.TDown, a.TDownS,
		a.ShGate, a.ShGateS, a.ShUp, a.ShUpS, a.ShDown, a.ShDownS,
		a.EG, a.EY, a.Hidden, a.Inter, pl.Ggu, pl.Gd, a.Y, a.NextNorm, pl.NT, npart, bar, a.Mo}
}

// moePersistOcc caches moePersistBPS per function.
var moePersistOcc sync.Map // *cuda.Function -> int

// moePersistBPS is the blocks an SM the grid of f may have: never more than
// fit at once (the barriers would wait for blocks that cannot start, until
// the trap). The driver's occupancy query decides (after asking for the most
// shared memory an SM); without it, the variant's __launch_bounds__ promise
// checked against f's registers.
func (k *Set) moePersistBPS(f *cuda.Function, want int) (int, error) {
	if v, ok := moePersistOcc.Load(f); ok {
		return v.(int), nil
	}
	if err := k.c.PreferMaxShared(f); err != nil {
		return 0, errors.Wrapf(err, "moe persist: %s", f.Name)
	}
	bps := want
	occ, err := k.c.MaxActiveBlocks(f, moePersistThreads, 0)
	switch {
	case errors.Is(err, cuda.ErrNoOccupancy):
		if err := moePersistFits(f.NumRegs, want, k.c.Info().MaxSharedOptin); err != nil {
			return 0, errors.Wrapf(err, "moe persist: %s", f.Name)
		}
	case err != nil:
		return 0, errors.Wrapf(err, "moe persist: %s", f.Name)
	case occ < 1:
		return 0, errors.Newf("moe persist: %s: no block fits an SM", f.Name)
	default:
		bps = min(want, occ)
	}
	if bps != want {
		slog.Warn("moe persist: fewer blocks an SM than the variant's bound", "kernel", f.Name, "blocks_per_sm", bps, "bound", want,
			"registers", f.NumRegs)
	}
	slog.Debug("moe persist: grid", "kernel", f.Name, "blocks_per_sm", bps, "registers", f.NumRegs, "occupancy", occ)
	moePersistOcc.Store(f, bps)
	return bps, nil
}

// moePersistFits says whether bps blocks of 256 threads at regs registers
// (and moePersistSmem of shared memory) fit one SM of 64K registers.
// optin: the device's shared memory a block may opt into (0: unknown).
func moePersistFits(regs, bps, optin int) error {
	// Registers are allocated per warp in units of 256.
	perWarp := cdiv(regs*32, 256) * 256
	if regs <= 0 || perWarp*(moePersistThreads/32)*bps > 65536 {
		return errors.Newf("%d registers a thread: %d blocks of %d threads do not fit an SM's 65536", regs, bps, moePersistThreads)
	}
	if optin > 0 && bps*(moePersistSmem+1024) > optin+1024 {
		return errors.Newf("%d blocks of %d bytes of shared memory do not fit an SM", bps, moePersistSmem)
	}
	return nil
}

// MoEPersistLoad compiles (or takes from the cache) and loads the
// persistent module now, so that no later launch loads it inside a graph
// capture; the error says why the kernel cannot run here.
func (k *Set) MoEPersistLoad() error {
	_, err := k.persist()
	return err
}

// MoEPersistPlanFor is the plan the launcher uses on this device for the
// current variant (tests and the timing report; loads the module).
func (k *Set) MoEPersistPlanFor(E, K, H, MI int, shared bool) (MoEPersistPlan, error) {
	v, ok := moePersistVariants[MoEPersistVariant]
	if !ok {
		return MoEPersistPlan{}, errors.Newf("moe persist: TILERT_GPU_MOE_PERSIST_V=%q", MoEPersistVariant)
	}
	mod, err := k.persist()
	if err != nil {
		return MoEPersistPlan{}, err
	}
	f, err := k.c.Function(mod, v.name)
	if err != nil {
		return MoEPersistPlan{}, err
	}
	bps, err := k.moePersistBPS(f, v.bps)
	if err != nil {
		return MoEPersistPlan{}, err
	}
	return moePersistPlanB(k.c.Info().SMs, E, K, H, MI, shared, bps), nil
}
