package engine

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"testing"
)

func TestLayoutSizes(t *testing.T) {
	for _, tc := range []struct {
		dt   CacheDType
		want int
	}{{CacheFP8DSMLA, 656}, {CacheBF16, 1152}} {
		if got := MLATokenBytes(tc.dt, 512, 64); got != tc.want {
			t.Errorf("%s: %d bytes/token, want %d", tc.dt, got, tc.want)
		}
	}
	if got := IndexerPageBytes(128); got != 8448 {
		t.Errorf("indexer page %d, want 8448", got)
	}
	l, err := NewLayout(CacheFP8DSMLA, 512, 64, 128, 100, []bool{true, false, true})
	if err != nil {
		t.Fatal(err)
	}
	// 2 pages per region; layer 1 has no indexer region.
	want := int64(3*2*64*656 + 2*2*8448)
	if l.SlotBytes != want || len(l.Regions) != 5 || l.MaxPages != 2 {
		t.Fatalf("layout %+v, want %d bytes", l, want)
	}
	r, ok := l.Region(2, RegionMLA)
	if !ok || r.Offset != int64(2*2*64*656+2*8448) {
		t.Errorf("layer 2 MLA region %+v", r)
	}
	if _, ok := l.Region(1, RegionIndexer); ok {
		t.Errorf("layer 1 must have no indexer region")
	}
	if _, err := NewLayout(CacheFP8DSMLA, 96, 64, 128, 64, []bool{true}); err == nil {
		t.Errorf("kv_lora_rank 96 must be refused")
	}
}

func TestMLAFP8Entry(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 1))
	lat, rope := make([]float32, 512), make([]float32, 64)
	for i := range lat {
		lat[i] = float32(r.NormFloat64() * float64(1+i/128)) // different tile ranges
	}
	for i := range rope {
		rope[i] = float32(r.NormFloat64())
	}
	lat[300] = 0
	buf := make([]byte, 656)
	EncodeMLAFP8(buf, lat, rope)
	for j := 0; j < 4; j++ {
		var amax float32
		for _, v := range lat[j*128 : j*128+128] {
			amax = max(amax, float32(math.Abs(float64(roundBF16(v)))))
		}
		s := math.Float32frombits(binary.LittleEndian.Uint32(buf[512+4*j:]))
		if s != amax/448 {
			t.Errorf("tile %d scale %g want %g", j, s, amax/448)
		}
	}
	gl, gr := make([]float32, 512), make([]float32, 64)
	DecodeMLAFP8(gl, gr, buf)
	for i, v := range lat {
		tile := float64(1 + i/128)
		if math.Abs(float64(gl[i]-v)) > 0.07*math.Abs(float64(v))+1e-3*tile {
			t.Fatalf("latent %d: %g vs %g", i, gl[i], v)
		}
	}
	if gl[300] != 0 {
		t.Errorf("zero must survive")
	}
	for i, v := range rope {
		if gr[i] != roundBF16(v) {
			t.Fatalf("rope %d: %g vs %g", i, gr[i], v)
		}
	}
	// all-zero tile: scale FLT_MIN, values zero
	EncodeMLAFP8(buf, make([]float32, 512), rope)
	DecodeMLAFP8(gl, gr, buf)
	for _, v := range gl {
		if v != 0 {
			t.Fatal("zero latent decoded nonzero")
		}
	}
	bb := make([]byte, 1152)
	EncodeMLABF16(bb, lat, rope)
	DecodeMLABF16(gl, gr, bb)
	for i, v := range lat {
		if gl[i] != roundBF16(v) {
			t.Fatal("bf16 latent mismatch")
		}
	}
}

func TestIndexerPage(t *testing.T) {
	r := rand.New(rand.NewPCG(2, 2))
	page := make([]byte, IndexerPageBytes(128))
	keys := make([][]float32, 64)
	for tok := range keys {
		k := make([]float32, 128)
		for i := range k {
			k[i] = float32(r.NormFloat64() * float64(tok+1) / 7)
		}
		keys[tok] = k
		EncodeIndexerKey(page, tok, k)
	}
	got := make([]float32, 128)
	for tok, k := range keys {
		s := math.Float32frombits(binary.LittleEndian.Uint32(page[64*128+4*tok:]))
		if fr, _ := math.Frexp(float64(s)); fr != 0.5 {
			t.Fatalf("scale %g is not a power of two", s)
		}
		var amax float64
		for _, v := range k {
			amax = math.Max(amax, math.Abs(float64(roundBF16(v))))
		}
		if float64(s) < amax/448 || float64(s) >= 2*amax/448 {
			t.Fatalf("tok %d scale %g for amax %g", tok, s, amax)
		}
		DecodeIndexerKey(got, page, tok)
		for i, v := range k {
			if math.Abs(float64(got[i]-v)) > 0.07*math.Abs(float64(v))+float64(s)*0.01 {
				t.Fatalf("tok %d dim %d: %g vs %g", tok, i, got[i], v)
			}
		}
	}
	if UE8M0Ceil(1) != 1 || UE8M0Ceil(1.0000001) != 2 || UE8M0Ceil(0.3) != 0.5 {
		t.Error("UE8M0Ceil")
	}
}

func TestSample(t *testing.T) {
	logits := []float32{1, 3, 2, 3, -1}
	if Sample(logits, Params{}, 0) != 1 {
		t.Error("greedy must pick the first max")
	}
	p := Params{Temperature: 1, TopK: 1, Seed: 9}
	for pos := 0; pos < 20; pos++ {
		if Sample(logits, p, pos) != 1 {
			t.Fatal("top-k 1 must be argmax")
		}
	}
	p = Params{Temperature: 0.7, Seed: 42}
	a := make([]int, 50)
	for i := range a {
		a[i] = Sample(logits, p, i)
		if Sample(logits, p, i) != a[i] {
			t.Fatal("not deterministic")
		}
	}
	// frequencies follow softmax(logits/T)
	p = Params{Temperature: 1.5, Seed: 7}
	const n = 40000
	cnt := make([]float64, len(logits))
	for i := 0; i < n; i++ {
		cnt[Sample(logits, p, i)]++
	}
	var z float64
	for _, v := range logits {
		z += math.Exp(float64(v) / 1.5)
	}
	for i, v := range logits {
		want := math.Exp(float64(v)/1.5) / z
		if math.Abs(cnt[i]/n-want) > 0.01 {
			t.Errorf("token %d freq %.3f want %.3f", i, cnt[i]/n, want)
		}
	}
	// top-p 0.5 keeps only the two tied best tokens (ids 1 and 3)
	p = Params{Temperature: 1, TopP: 0.5, Seed: 3}
	seen := map[int]bool{}
	for i := 0; i < 200; i++ {
		seen[Sample(logits, p, i)] = true
	}
	if len(seen) != 2 || !seen[1] || !seen[3] {
		t.Errorf("top-p 0.5 picked %v", seen)
	}
	// min_p keeps the tokens at least MinP times as likely as the best one
	// (after temperature), renormalised: the draws' frequencies follow.
	mlog := []float32{0, 1, 2, 3, 2.5, -1}
	for _, mp := range []struct {
		minP, temp float64
	}{{0.3, 1}, {0.05, 0.5}, {1, 1}, {0.5, 2}} {
		p := Params{Temperature: mp.temp, MinP: mp.minP, Seed: 9}
		want := make([]float64, len(mlog))
		var z float64
		for i, v := range mlog {
			if e := math.Exp((float64(v) - 3) / mp.temp); e >= mp.minP {
				want[i] = e
				z += e
			}
		}
		cnt := make([]float64, len(mlog))
		const draws = 20000
		for i := 0; i < draws; i++ {
			cnt[Sample(mlog, p, i)]++
		}
		for i := range mlog {
			if want[i] == 0 && cnt[i] > 0 {
				t.Errorf("min_p %g T %g: token %d drawn %v times, below min_p", mp.minP, mp.temp, i, cnt[i])
			}
			if f := cnt[i] / draws; math.Abs(f-want[i]/z) > 0.015 {
				t.Errorf("min_p %g T %g: token %d freq %.3f want %.3f", mp.minP, mp.temp, i, f, want[i]/z)
			}
		}
	}
}
