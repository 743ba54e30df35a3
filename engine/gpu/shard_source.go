package gpu

import (
	"strings"

	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/model"
	"github.com/tilert-go/tilert/numeric"
)

// The tensor-parallel split (docs/ARCHITECTURE.md, "One decode node on N
// GPUs"): rank k of N holds
//   - attention heads [h0,h1): q_b_proj rows, W_UK/W_UV heads, o_proj columns;
//   - intermediate columns [i0,i1) of the dense MLP, the shared expert and
//     every routed expert: gate/up rows, down columns;
//   - vocabulary rows [v0,v1) of the heads (lm_head, the MTP shared head);
//   - everything else whole (q_a, kv_a, the indexer, the router, norms,
//     embeddings, eh_proj): small, or read one row per token.
// Each rank's partial attention output and partial MLP output are summed
// across ranks; everything between those sums runs replicated.

// span is a half-open range [lo,hi).
type span struct{ lo, hi int }

func (s span) n() int { return s.hi - s.lo }

// part is rank k's share of n units split over N ranks: the first n%N ranks
// get one unit more, so rank 0 is never empty while n > 0.
func part(n, N, k int) span {
	base, rem := n/N, n%N
	lo := k*base + min(k, rem)
	hi := lo + base
	if k < rem {
		hi++
	}
	return span{lo, hi}
}

// shardPlan is rank k's share of every split dimension.
type shardPlan struct {
	rank, ranks int
	heads       span // attention heads
	inter       span // dense MLP intermediate
	moe         span // routed and shared expert intermediate
	vocab       span // head rows
}

func planShard(c *model.Config, N, k int) shardPlan {
	return shardPlan{
		rank: k, ranks: N,
		heads: part(c.NumHeads, N, k),
		inter: part(c.IntermediateSize, N, k),
		moe:   part(c.MoEIntermediateSize, N, k),
		vocab: part(c.VocabSize, N, k),
	}
}

// checkShardable says whether c splits over N ranks.
func checkShardable(c *model.Config, N int) error {
	if N < 1 || N > 64 {
		return errors.WithHint(errors.Newf("%d ranks", N), "use 1 to 64 ranks (one per GPU)")
	}
	if c.NSharedExperts > 1 {
		return errors.Newf("the tensor-parallel split handles one shared expert (model has %d)", c.NSharedExperts)
	}
	if c.VocabSize < N {
		return errors.Newf("vocabulary of %d rows cannot be split over %d ranks", c.VocabSize, N)
	}
	for k := 0; k < N; k++ {
		p := planShard(c, N, k)
		// Routed experts run through the FP8 experts GEMV only: their
		// slices must keep whole 128-blocks of scales.
		if !blockAligned(p.moe) && c.NRoutedExperts > 0 {
			return errors.WithHint(errors.Newf("moe_intermediate_size %d split over %d ranks gives rank %d columns [%d,%d), which cut a 128-column FP8 scale block",
				c.MoEIntermediateSize, N, k, p.moe.lo, p.moe.hi), "use a rank count that divides moe_intermediate_size/128")
		}
	}
	return nil
}

// blockAligned reports whether a slice [lo,hi) of a block-scaled axis keeps
// one scale per 128-block of the slice: it starts on a block, or it lies
// inside one block.
func blockAligned(s span) bool {
	return s.n() == 0 || s.lo%numeric.FP8BlockSize == 0 || s.lo/numeric.FP8BlockSize == (s.hi-1)/numeric.FP8BlockSize
}

// shardSource is rank k's view of a Source: Config has the rank's head and
// intermediate counts, and every split weight comes back sliced (FP8 when
// the slice keeps whole scale blocks, else dequantised to float32, which
// the float32 GEMV runs).
type shardSource struct {
	src   Source
	full  *model.Config
	local *model.Config
	p     shardPlan
}

func newShardSource(src Source, N, k int) *shardSource {
	full := src.Config()
	p := planShard(full, N, k)
	local := *full
	local.NumHeads = p.heads.n()
	local.IntermediateSize = p.inter.n()
	local.MoEIntermediateSize = p.moe.n()
	return &shardSource{src: src, full: full, local: &local, p: p}
}

func (s *shardSource) Config() *model.Config { return s.local }

// Get passes through: vectors and tables are whole on every rank.
func (s *shardSource) Get(name string) (*model.Tensor, error) { return s.src.Get(name) }

func (s *shardSource) Linear(name string, rows, cols int) (*Matrix, error) {
	c := s.full
	qk := c.QKNopeHeadDim + c.QKRopeHeadDim
	H := c.HiddenSize
	switch {
	case strings.HasSuffix(name, "q_b_proj.weight"):
		return s.rows(name, c.NumHeads*qk, cols, span{s.p.heads.lo * qk, s.p.heads.hi * qk})
	case strings.HasSuffix(name, "o_proj.weight"):
		vd := c.VHeadDim
		return s.cols(name, rows, c.NumHeads*vd, span{s.p.heads.lo * vd, s.p.heads.hi * vd})
	case strings.HasSuffix(name, "shared_experts.gate_proj.weight"), strings.HasSuffix(name, "shared_experts.up_proj.weight"):
		return s.rows(name, c.MoEIntermediateSize, H, s.p.moe)
	case strings.HasSuffix(name, "shared_experts.down_proj.weight"):
		return s.cols(name, H, c.MoEIntermediateSize, s.p.moe)
	case strings.HasSuffix(name, "mlp.gate_proj.weight"), strings.HasSuffix(name, "mlp.up_proj.weight"):
		return s.rows(name, c.IntermediateSize, H, s.p.inter)
	case strings.HasSuffix(name, "mlp.down_proj.weight"):
		return s.cols(name, H, c.IntermediateSize, s.p.inter)
	case name == model.LMHeadName, strings.HasSuffix(name, "shared_head.head.weight"):
		return s.rows(name, c.VocabSize, H, s.p.vocab)
	}
	return s.src.Linear(name, rows, cols)
}

func (s *shardSource) rows(name string, rows, cols int, sp span) (*Matrix, error) {
	m, err := s.src.Linear(name, rows, cols)
	if err != nil {
		return nil, err
	}
	return sliceRows(m, sp), nil
}

func (s *shardSource) cols(name string, rows, cols int, sp span) (*Matrix, error) {
	m, err := s.src.Linear(name, rows, cols)
	if err != nil {
		return nil, err
	}
	return sliceCols(m, sp), nil
}

func (s *shardSource) Expert(layer, e int, proj string, rows, cols int) (*Matrix, error) {
	c := s.full
	H, MI := c.HiddenSize, c.MoEIntermediateSize
	var m *Matrix
	var err error
	if proj == "down_proj" {
		if m, err = s.src.Expert(layer, e, proj, H, MI); err == nil {
			m = sliceCols(m, s.p.moe)
		}
	} else if m, err = s.src.Expert(layer, e, proj, MI, H); err == nil {
		m = sliceRows(m, s.p.moe)
	}
	if err == nil && m.FP8 == nil && len(m.F32) > 0 {
		err = errors.Newf("layer %d expert %d %s: rank %d's slice does not keep whole FP8 scale blocks", layer, e, proj, s.p.rank)
	}
	return m, err
}

// Absorbed slices W_UK [heads][nope][R] and W_UV [heads][v][R] by heads
// (their scales are per row, so any head range slices exactly).
func (s *shardSource) Absorbed(layer int) (*Matrix, *Matrix, error) {
	uk, uv, err := s.src.Absorbed(layer)
	if err != nil {
		return nil, nil, err
	}
	c := s.full
	h := s.p.heads
	return sliceRowScaled(uk, h.lo*c.QKNopeHeadDim, h.hi*c.QKNopeHeadDim),
		sliceRowScaled(uv, h.lo*c.VHeadDim, h.hi*c.VHeadDim), nil
}

func sliceRowScaled(m *Matrix, lo, hi int) *Matrix {
	out := &Matrix{Rows: hi - lo, Cols: m.Cols}
	if m.FP8 != nil {
		rb := (m.Cols + 127) / 128
		out.FP8 = m.FP8[lo*m.Cols : hi*m.Cols]
		out.Scale = m.Scale[lo*rb : hi*rb]
		return out
	}
	out.F32 = m.F32[lo*m.Cols : hi*m.Cols]
	return out
}

// sliceRows keeps rows sp of a linear weight.
func sliceRows(m *Matrix, sp span) *Matrix {
	out := &Matrix{Rows: sp.n(), Cols: m.Cols}
	switch {
	case m.FP8 == nil:
		out.F32 = m.F32[sp.lo*m.Cols : sp.hi*m.Cols]
	case sp.n() == 0:
		out.F32 = []float32{}
	case blockAligned(sp):
		cb := (m.Cols + 127) / 128
		out.FP8 = m.FP8[sp.lo*m.Cols : sp.hi*m.Cols]
		out.Scale = m.Scale[(sp.lo/128)*cb : ((sp.hi-1)/128+1)*cb]
	default:
		out.F32 = dequant(m, sp, span{0, m.Cols})
	}
	return out
}

// sliceCols keeps columns sp of a linear weight.
func sliceCols(m *Matrix, sp span) *Matrix {
	out := &Matrix{Rows: m.Rows, Cols: sp.n()}
	switch {
	case m.FP8 == nil:
		out.F32 = make([]float32, 0, m.Rows*sp.n())
		for r := 0; r < m.Rows; r++ {
			out.F32 = append(out.F32, m.F32[r*m.Cols+sp.lo:r*m.Cols+sp.hi]...)
		}
	case sp.n() == 0:
		out.F32 = []float32{}
	case blockAligned(sp):
		cb := (m.Cols + 127) / 128
		b0, b1 := sp.lo/128, (sp.hi-1)/128+1
		out.FP8 = make([]byte, 0, m.Rows*sp.n())
		for r := 0; r < m.Rows; r++ {
			out.FP8 = append(out.FP8, m.FP8[r*m.Cols+sp.lo:r*m.Cols+sp.hi]...)
		}
		for rb := 0; rb < (m.Rows+127)/128; rb++ {
			out.Scale = append(out.Scale, m.Scale[rb*cb+b0:rb*cb+b1]...)
		}
	default:
		out.F32 = dequant(m, span{0, m.Rows}, sp)
	}
	return out
}

// dequant returns rows × cols of an FP8 block-scaled weight as float32,
// W = w * s[i/128][j/128] (DeepSeek's formula).
func dequant(m *Matrix, rows, cols span) []float32 {
	cb := (m.Cols + 127) / 128
	out := make([]float32, 0, rows.n()*cols.n())
	for i := rows.lo; i < rows.hi; i++ {
		for j := cols.lo; j < cols.hi; j++ {
			out = append(out, numeric.FP8E4M3ToFloat32(m.FP8[i*m.Cols+j])*m.Scale[(i/128)*cb+j/128])
		}
	}
	return out
}
