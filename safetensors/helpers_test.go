package safetensors

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cockroachdb/errors"
)

// rawFile builds a file from a literal JSON header and dataLen data bytes,
// bypassing the writer so tests can express corrupt headers.
func rawFile(header string, dataLen int) []byte {
	b := make([]byte, 8, 8+len(header)+dataLen)
	binary.LittleEndian.PutUint64(b, uint64(len(header)))
	b = append(b, header...)
	for i := range dataLen {
		b = append(b, byte(i))
	}
	return b
}

func writeRaw(t *testing.T, dir, name string, data []byte) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// checkErr asserts err names every fragment (file, tensor, ...) and carries a hint.
func checkErr(t *testing.T, err error, fragments ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("no error, want one naming %q", fragments)
	}
	msg := err.Error()
	for _, f := range fragments {
		if !strings.Contains(msg, f) {
			t.Errorf("error %q does not mention %q", msg, f)
		}
	}
	if len(errors.GetAllHints(err)) == 0 {
		t.Errorf("error %q has no hint", msg)
	}
}
