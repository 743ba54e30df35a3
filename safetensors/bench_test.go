package safetensors

import (
	"fmt"
	"path/filepath"
	"testing"
)

// benchFile writes n tensors of size bytes each and returns the path.
func benchFile(b *testing.B, n, size int) (string, []Tensor) {
	b.Helper()
	ts := make([]Tensor, n)
	for i := range ts {
		d := make([]byte, size)
		for j := range d {
			d[j] = byte(i + j)
		}
		ts[i] = Tensor{TensorInfo{Name: fmt.Sprintf("model.layers.%d.mlp.experts.%d.down_proj.weight", i/8, i%8),
			DType: F8E4M3, Shape: []int64{int64(size)}}, d}
	}
	path := filepath.Join(b.TempDir(), "bench.safetensors")
	if err := WriteFile(path, ts, map[string]string{"format": "pt"}); err != nil {
		b.Fatal(err)
	}
	return path, ts
}

// BenchmarkData measures the zero-copy lookup alone: it must not allocate.
func BenchmarkData(b *testing.B) {
	path, ts := benchFile(b, 64, 4096)
	f, err := Open(path)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		if _, err := f.Data(ts[i%len(ts)].Info.Name); err != nil {
			b.Fatal(err)
		}
		i++
	}
}

// BenchmarkReadMapped streams every tensor's bytes through the mapping (page
// cache warm after the first pass), i.e. what a loader pays per byte.
func BenchmarkReadMapped(b *testing.B) {
	path, ts := benchFile(b, 64, 1<<20)
	f, err := Open(path)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	b.SetBytes(int64(len(ts)) << 20)
	b.ReportAllocs()
	var sink uint64
	for b.Loop() {
		for _, t := range ts {
			d, err := f.Data(t.Info.Name)
			if err != nil {
				b.Fatal(err)
			}
			// Touch one word per cache line so the pages are really read.
			for j := 0; j < len(d); j += 64 {
				sink += uint64(d[j])
			}
		}
	}
	_ = sink
}

// BenchmarkOpen measures header parse + mmap for a 1024-tensor shard.
func BenchmarkOpen(b *testing.B) {
	path, _ := benchFile(b, 1024, 64)
	b.ReportAllocs()
	for b.Loop() {
		f, err := Open(path)
		if err != nil {
			b.Fatal(err)
		}
		f.Close()
	}
}

// BenchmarkWriteFile measures streaming write throughput including fsync.
func BenchmarkWriteFile(b *testing.B) {
	for _, size := range []int{64 << 10, 4 << 20} {
		b.Run(fmt.Sprintf("tensor=%dKiB", size>>10), func(b *testing.B) {
			const total = 64 << 20
			n := total / size
			ts := make([]Tensor, n)
			for i := range ts {
				ts[i] = Tensor{TensorInfo{Name: fmt.Sprintf("t%d", i), DType: U8, Shape: []int64{int64(size)}}, make([]byte, size)}
			}
			path := filepath.Join(b.TempDir(), "w.safetensors")
			b.SetBytes(total)
			b.ReportAllocs()
			for b.Loop() {
				if err := WriteFile(path, ts, nil); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
