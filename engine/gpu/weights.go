package gpu

import (
	"encoding/binary"
	"log/slog"
	"math"

	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/cuda"
	"github.com/tilert-go/tilert/engine/internal/blockw"
	"github.com/tilert-go/tilert/model"
	"github.com/tilert-go/tilert/numeric"
	"github.com/tilert-go/tilert/weights"
)

type linKind int

const (
	linFP8  linKind = iota // e4m3 + [ceil(out/128)][ceil(in/128)] float32 block scales
	linBF16                // bf16 (the source's values are exactly bf16)
	linF32
)

// dlin is a linear weight [out][in] in device memory.
type dlin struct {
	kind    linKind
	w, s    cuda.DevPtr
	out, in int
}

// dabs is an absorbed MLA matrix [heads][rows][kv_lora] in device memory:
// fp8 with per-row scales, or float32.
type dabs struct {
	fp8  bool
	w, s cuda.DevPtr
}

// dlayer is one decoder block's weights on the device (main or MTP): the
// shared part (blockw) plus the absorbed MLA matrices, the routed experts
// and the MTP layer's head and embedding.
type dlayer struct {
	*blockw.Block[dlin, cuda.DevPtr]
	uk, uv     dabs
	expW, expS [3]cuda.DevPtr // device tables of per-expert pointers: gate, up, down
	head       dlin
	embed      cuda.DevPtr // bf16 [vocab][hidden]
}

type dweights struct {
	embed  cuda.DevPtr // bf16 [vocab][hidden]
	norm   cuda.DevPtr
	head   dlin
	layers []*dlayer // main layers, then the MTP layer(s)
	bytes  int64
}

// uploader copies host weights to the device, remembering the first error.
type uploader struct {
	b     device
	src   Source
	err   error
	bytes int64
	ptrs  []cuda.DevPtr
	// placed: where a shared expert matrix (matrixSharer) went first, its
	// weights and scales; nil for other sources.
	placed map[*Matrix][2]cuda.DevPtr
	// copied counts the expert matrices copied device to device (tests);
	// filled the device copies that repeat a periodic tensor's period.
	copied, filled int
}

func newUploader(b device, src Source) *uploader {
	u := &uploader{b: b, src: src}
	if ms, ok := src.(matrixSharer); ok && ms.sharesMatrices() {
		u.placed = map[*Matrix][2]cuda.DevPtr{}
	}
	return u
}

func (u *uploader) fail(err error) {
	if u.err == nil && err != nil {
		u.err = err
	}
}

func (u *uploader) raw(data []byte) cuda.DevPtr {
	p := u.alloc(len(data))
	if u.err == nil {
		u.fail(u.b.upload(p, data))
	}
	return p
}

// alloc takes device memory for n bytes of weights (0 after an error).
func (u *uploader) alloc(n int) cuda.DevPtr {
	if u.err != nil {
		return 0
	}
	p, err := u.b.alloc(int64(max(n, 4)))
	if err != nil {
		u.fail(errors.Wrapf(err, "allocating %d bytes of weights", n))
		return 0
	}
	u.ptrs = append(u.ptrs, p)
	u.bytes += int64(n)
	return p
}

func f32Bytes(v []float32) []byte {
	b := make([]byte, 4*len(v))
	numeric.EncodeF32(b, v)
	return b
}

func (u *uploader) f32(v []float32) cuda.DevPtr { return u.raw(f32Bytes(v)) }

// exactBF16 reports whether every value survives a round trip through bf16
// (checkpoints store norms, embeddings and heads as bf16).
func exactBF16(v []float32) bool {
	for _, x := range v {
		if numeric.BF16ToFloat32(numeric.Float32ToBF16(x)) != x && !math.IsNaN(float64(x)) {
			return false
		}
	}
	return true
}

// periodic places the rows x cols bf16 tensor name of a periodic source:
// one period from the host, then copies on the device that double the
// filled span (each copy reads a whole number of periods from the start).
// ok false: the source has no period for it (or another shape), and
// nothing was done.
func (u *uploader) periodic(name string, rows, cols int) (cuda.DevPtr, bool) {
	ps, ok := u.src.(periodic)
	if !ok || u.err != nil {
		return 0, false
	}
	per, r, c, ok := ps.periodicBF16(name)
	n := rows * cols
	if !ok || r != rows || c != cols || len(per) == 0 || len(per) > n || !exactBF16(per) {
		return 0, false
	}
	p := u.alloc(2 * n)
	if u.err != nil {
		return 0, true
	}
	b := make([]byte, 2*len(per))
	numeric.EncodeBF16(b, per)
	u.fail(u.b.upload(p, b))
	for done := len(per); done < n && u.err == nil; {
		c := min(done, n-done)
		u.fail(u.b.copyDD(p.Add(int64(2*done)), p, int64(2*c)))
		done += c
		u.filled++
	}
	return p, true
}

func (u *uploader) bf16(v []float32) cuda.DevPtr {
	b := make([]byte, 2*len(v))
	numeric.EncodeBF16(b, v)
	return u.raw(b)
}

func (u *uploader) get(name string, n int) []float32 {
	if u.err != nil {
		return nil
	}
	t, err := u.src.Get(name)
	if err != nil {
		u.fail(err)
		return nil
	}
	if len(t.Data) != n {
		u.fail(errors.Newf("weight %s: %d values, want %d", name, len(t.Data), n))
		return nil
	}
	return t.Data
}

func (u *uploader) vec(name string, n int) cuda.DevPtr {
	v := u.get(name, n)
	if v == nil {
		return 0
	}
	return u.f32(v)
}

func (u *uploader) matrix(m *Matrix, out, in int) dlin {
	l := dlin{out: out, in: in}
	switch {
	case m.FP8 != nil:
		l.kind, l.w, l.s = linFP8, u.raw(m.FP8), u.f32(m.Scale)
	case exactBF16(m.F32):
		l.kind, l.w = linBF16, u.bf16(m.F32)
	default:
		l.kind, l.w = linF32, u.f32(m.F32)
	}
	return l
}

// Lin and Vec make uploader a blockw.Loader.
func (u *uploader) Lin(name string, out, in int) dlin  { return u.lin(name, out, in) }
func (u *uploader) Vec(name string, n int) cuda.DevPtr { return u.vec(name, n) }

func (u *uploader) lin(name string, out, in int) dlin {
	if u.err != nil {
		return dlin{}
	}
	if p, ok := u.periodic(name, out, in); ok {
		return dlin{kind: linBF16, w: p, out: out, in: in}
	}
	m, err := u.src.Linear(name, out, in)
	if err != nil {
		u.fail(err)
		return dlin{}
	}
	return u.matrix(m, out, in)
}

// table is the bf16 embedding/head table; a float32 source that is not
// exactly bf16 is rounded (logged), as the embedding kernel reads bf16.
func (u *uploader) table(name string, rows, cols int) cuda.DevPtr {
	if p, ok := u.periodic(name, rows, cols); ok {
		return p
	}
	v := u.get(name, rows*cols)
	if v == nil {
		return 0
	}
	if !exactBF16(v) {
		slog.Warn("gpu engine: table is not bf16 in the checkpoint; rounding it to bf16", "tensor", name)
	}
	return u.bf16(v)
}

func (u *uploader) absorbed(m *Matrix) dabs {
	if m.FP8 != nil {
		return dabs{fp8: true, w: u.raw(m.FP8), s: u.f32(m.Scale)}
	}
	return dabs{w: u.f32(m.F32)}
}

// experts uploads one projection of every routed expert of a layer as one
// stack (each expert 256-byte aligned) and returns device tables of the
// experts' weight and scale pointers for the experts GEMV.
func (u *uploader) experts(layer, E int, proj string, rows, cols int) (wt, st cuda.DevPtr) {
	if u.err != nil {
		return 0, 0
	}
	wper := int64(rows*cols+255) &^ 255
	nsc := ((rows + 127) / 128) * ((cols + 127) / 128)
	sper := int64(4*nsc+255) &^ 255
	wbase, err := u.b.alloc(wper * int64(E))
	if err != nil {
		u.fail(err)
		return 0, 0
	}
	u.ptrs = append(u.ptrs, wbase)
	sbase, err := u.b.alloc(sper * int64(E))
	if err != nil {
		u.fail(err)
		return 0, 0
	}
	u.ptrs = append(u.ptrs, sbase)
	wtab := make([]byte, 8*E)
	stab := make([]byte, 8*E)
	for e := 0; e < E && u.err == nil; e++ {
		m, err := u.src.Expert(layer, e, proj, rows, cols)
		if err != nil {
			u.fail(err)
			break
		}
		if m.FP8 == nil {
			u.fail(errors.WithHint(errors.Newf("layer %d expert %d %s is not FP8: the GPU device runs routed experts as FP8 only", layer, e, proj),
				"use the FP8 checkpoint, or --device cpu"))
			break
		}
		wp, sp := wbase.Add(int64(e)*wper), sbase.Add(int64(e)*sper)
		if at, ok := u.placed[m]; ok {
			u.fail(u.b.copyDD(wp, at[0], int64(len(m.FP8))))
			u.fail(u.b.copyDD(sp, at[1], int64(4*len(m.Scale))))
			u.copied++
		} else {
			u.fail(u.b.upload(wp, m.FP8))
			u.fail(u.b.upload(sp, f32Bytes(m.Scale)))
			if u.placed != nil {
				u.placed[m] = [2]cuda.DevPtr{wp, sp}
			}
		}
		u.bytes += int64(len(m.FP8) + 4*len(m.Scale))
		binary.LittleEndian.PutUint64(wtab[8*e:], uint64(wp))
		binary.LittleEndian.PutUint64(stab[8*e:], uint64(sp))
	}
	return u.raw(wtab), u.raw(stab)
}

// uploadWeights copies the model onto the device.
func uploadWeights(b device, src Source, c *model.Config) (*dweights, []cuda.DevPtr, error) {
	u := newUploader(b, src)
	eb, _ := src.(expertBanker)
	var bank *dlayer // the MoE layer whose experts the others share (expertBanker)
	H, V := c.HiddenSize, c.VocabSize
	w := &dweights{embed: u.table(model.EmbedTokensName, V, H), norm: u.vec(model.FinalNormName, H)}
	if c.TieWordEmbeddings {
		w.head = dlin{kind: linBF16, w: w.embed, out: V, in: H}
	} else {
		w.head = u.lin(model.LMHeadName, V, H)
	}
	for i := 0; i < c.NumAllLayers() && u.err == nil; i++ {
		n := model.Layer(i)
		lw := &dlayer{Block: blockw.Load(c, i, blockw.Loader[dlin, cuda.DevPtr](u))}
		if u.err == nil {
			uk, uv, err := src.Absorbed(i)
			if err != nil {
				u.fail(err)
			} else {
				lw.uk, lw.uv = u.absorbed(uk), u.absorbed(uv)
			}
		}
		if lw.MoE && bank != nil {
			// Every MoE layer has the config's E x I x H experts.
			lw.expW, lw.expS = bank.expW, bank.expS
		} else if lw.MoE {
			E, I := c.NRoutedExperts, c.MoEIntermediateSize
			for p, proj := range weights.ExpertProjs {
				rows, cols := I, H
				if proj == "down_proj" {
					rows, cols = H, I
				}
				lw.expW[p], lw.expS[p] = u.experts(i, E, proj, rows, cols)
			}
			if eb != nil && eb.oneExpertBank() {
				bank = lw
			}
		}
		if lw.MTP {
			// The MTP copies of the head and embedding are optional in
			// checkpoints (the CPU engine falls back the same way).
			lw.head, lw.embed = w.head, w.embed
			if u.err == nil {
				if p, ok := u.periodic(n.SharedHeadHead, V, H); ok {
					lw.head = dlin{kind: linBF16, w: p, out: V, in: H}
				} else if m, err := src.Linear(n.SharedHeadHead, V, H); err == nil {
					lw.head = u.matrix(m, V, H)
				}
				if p, ok := u.periodic(n.MTPEmbed, V, H); ok {
					lw.embed = p
				} else if t, err := src.Get(n.MTPEmbed); err == nil && len(t.Data) == V*H {
					if !exactBF16(t.Data) {
						slog.Warn("gpu engine: table is not bf16 in the checkpoint; rounding it to bf16", "tensor", n.MTPEmbed)
					}
					lw.embed = u.bf16(t.Data)
				}
			}
		}
		w.layers = append(w.layers, lw)
	}
	w.bytes = u.bytes
	if u.err != nil {
		for _, p := range u.ptrs {
			_ = b.free(p)
		}
		return nil, nil, u.err
	}
	return w, u.ptrs, nil
}
