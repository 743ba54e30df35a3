package cupti

import (
	"strings"
	"testing"
)

// TestLibrary loads libcupti where there is one (no GPU needed): every
// symbol resolves, a result code reads back as CUPTI's message, and its
// clock runs.
func TestLibrary(t *testing.T) {
	tr, err := Open()
	if err != nil {
		t.Skipf("no libcupti here: %v", err)
	}
	t.Logf("libcupti: %s", tr.Path())
	err = tr.l.check("probe", resultMaxLimitReached)
	if err == nil || !strings.Contains(err.Error(), "error 12 ") || strings.HasSuffix(err.Error(), "error 12 ") {
		t.Errorf("result 12 reads %v, want CUPTI's message for it", err)
	}
	t.Logf("result 12: %v", err)
	a, err := tr.Now()
	if err != nil {
		t.Fatal(err)
	}
	b, err := tr.Now()
	if err != nil {
		t.Fatal(err)
	}
	if a == 0 || b < a {
		t.Errorf("CUPTI clock %d then %d", a, b)
	}
}
