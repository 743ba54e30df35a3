package kernels

import (
	"regexp"
	"strings"
	"testing"
)

// TestModuleSourceSharedHeaders: each header the default module shares
// with a module beside it is in both sources once, right after common.cuh
// (before any .cu that uses it), and the extra module's own files define
// none of the header's device code again (the copies the headers replaced).
func TestModuleSourceSharedHeaders(t *testing.T) {
	defs := regexp.MustCompile(`(?m)^(?:__device__ __forceinline__ [\w:<>*& ]+?\b(\w+)\(|struct (\w+) \{|#define (\w+))`)
	for _, tc := range []struct {
		header, module, own string
		src                 func() string
	}{
		{gemvTileHeader, "mid", "cu/mid/", MidKernelSource},
		{topkRadixHeader, "few", "cu/few/", FewKernelSource},
		{mlaAbsorbHeader, "absorb", "cu/absorb/", AbsorbKernelSource},
		{gemvTileHeader, "absorb", "cu/absorb/", AbsorbKernelSource},
	} {
		text, err := kernelFS.ReadFile(tc.header)
		if err != nil {
			t.Fatal(err)
		}
		name := strings.TrimPrefix(tc.header, "cu/")
		for mod, src := range map[string]string{"default": KernelSource(), tc.module: tc.src()} {
			mark := "#line 1 \"" + name + "\"\n"
			if n := strings.Count(src, mark+string(text)); n != 1 {
				t.Errorf("%s module: %s in it %d times, want once", mod, name, n)
				continue
			}
			at := strings.Index(src, mark)
			if first := strings.Index(src, ".cu\"\n"); first >= 0 && first < at {
				t.Errorf("%s module: %s comes after a .cu file", mod, name)
			}
		}
		var names []string
		for _, m := range defs.FindAllStringSubmatch(string(text), -1) {
			names = append(names, m[1]+m[2]+m[3])
		}
		if len(names) < 3 {
			t.Fatalf("%s: found only %v", name, names)
		}
		src := tc.src()
		own := src[strings.Index(src, "#line 1 \""+strings.TrimPrefix(tc.own, "cu/")):]
		for _, n := range names {
			if regexp.MustCompile(`(?m)^(?:__device__ __forceinline__ [\w:<>*& ]+?\b` + n + `\(|struct ` + n + ` \{|#define ` + n + `\b)`).MatchString(own) {
				t.Errorf("%s module's own files define %s again (it is %s's)", tc.module, n, name)
			}
		}
	}
}
