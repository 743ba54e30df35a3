package converter

import (
	"bufio"
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/tilert-go/tilert/model/synth"
)

// benchSource returns a synthetic deepseek-v3.2-2layer checkpoint (real DeepSeek-V3.2 layer
// dimensions, ~4.9 GB), generated once into $TILERT_BENCH_DIR or the user cache directory and
// reused by later runs.
func benchSource(b *testing.B) string {
	root := os.Getenv("TILERT_BENCH_DIR")
	if root == "" {
		c, err := os.UserCacheDir()
		if err != nil {
			b.Skipf("no cache dir for the benchmark checkpoint: %v (set TILERT_BENCH_DIR)", err)
		}
		root = filepath.Join(c, "tilert-bench")
	}
	dir := filepath.Join(root, "deepseek-v3.2-2layer")
	if _, err := os.Stat(filepath.Join(dir, "config.json")); err == nil {
		return dir
	}
	if err := os.MkdirAll(root, 0o755); err != nil {
		b.Fatal(err)
	}
	b.Logf("generating %s (once)", dir)
	if err := synth.Write("deepseek-v3.2-2layer", dir, 0, nil); err != nil {
		b.Fatal(err)
	}
	return dir
}

// procStatus reads a kB field of /proc/self/status in bytes (0 when unavailable).
func procStatus(field string) int64 {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), field+":"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10
		}
	}
	return 0
}

// resetPeakRSS restarts VmHWM from the current RSS (Linux clear_refs 5), so generating the
// source checkpoint does not count against the conversion.
func resetPeakRSS() bool {
	return os.WriteFile("/proc/self/clear_refs", []byte("5"), 0) == nil
}

// BenchmarkConvert2Layer converts the >= 4 GB synthetic checkpoint and reports GB/s and the
// process's peak RSS during the conversions.
func BenchmarkConvert2Layer(b *testing.B) {
	src := benchSource(b)
	b.ReportAllocs()
	if !resetPeakRSS() {
		b.Log("cannot reset VmHWM; peak RSS includes the checkpoint generation")
	}
	// TILERT_BENCH_OUT puts the output elsewhere (e.g. /dev/shm to measure the converter without
	// the disk); by default it goes to the temp directory.
	outRoot := os.Getenv("TILERT_BENCH_OUT")
	if outRoot == "" {
		outRoot = b.TempDir()
	}
	workers, _ := strconv.Atoi(os.Getenv("TILERT_BENCH_WORKERS")) // 0: the default
	var bytes int64
	var secs float64
	b.ResetTimer()
	for i := range b.N {
		out := filepath.Join(outRoot, "out"+strconv.Itoa(i))
		s, err := Convert(context.Background(), Options{ModelDir: src, SaveDir: out, Devices: 1, AppendMTP: true, Workers: workers})
		if err != nil {
			b.Fatalf("%+v", err)
		}
		bytes += s.Bytes
		secs += s.Duration.Seconds()
		b.StopTimer()
		os.RemoveAll(out)
		b.StartTimer()
	}
	b.SetBytes(bytes / int64(b.N))
	b.ReportMetric(float64(bytes)/1e9/secs, "GB/s")
	b.ReportMetric(float64(procStatus("VmHWM"))/(1<<20), "peakRSS_MiB")
}
