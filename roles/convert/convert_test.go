package convert

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/urfave/cli/v2"

	"github.com/tilert-go/tilert/model/synth"
	"github.com/tilert-go/tilert/weights"
)

func app(out *bytes.Buffer) *cli.App {
	return &cli.App{Name: "tilert", Writer: out, Commands: []*cli.Command{Command()}, ExitErrHandler: func(*cli.Context, error) {}}
}

func TestConvertCommand(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "hf")
	if err := synth.Write("glm-5-tiny", src, 0, nil); err != nil {
		t.Fatal(err)
	}
	save := filepath.Join(dir, "out")
	var out bytes.Buffer
	err := app(&out).Run([]string{"tilert", "convert", "--model_type", "glm-5.1", "--model_dir", src, "--save_dir", save, "--devices", "2", "--append-mtp=false"})
	if err != nil {
		t.Fatalf("%+v", err)
	}
	if !strings.Contains(out.String(), "converted") || !strings.Contains(out.String(), "GB/s") {
		t.Errorf("summary %q", out.String())
	}
	m, err := weights.ReadManifest(save)
	if err != nil {
		t.Fatal(err)
	}
	if m.Devices != 2 || m.MTPLayers != 0 || m.ModelName != "glm-5.1" {
		t.Errorf("flags not applied: devices %d mtp %d name %q", m.Devices, m.MTPLayers, m.ModelName)
	}

	out.Reset()
	if err := app(&out).Run([]string{"tilert", "convert", "--verify", save}); err != nil {
		t.Fatalf("%+v", err)
	}
	if !strings.Contains(out.String(), "ok") {
		t.Errorf("verify output %q", out.String())
	}

	// Without --model the default model name does not veto the checkpoint; an existing output
	// needs --force.
	err = app(&out).Run([]string{"tilert", "convert", "--model-dir", src, "--save-dir", save})
	if err == nil || !strings.Contains(err.Error(), "already exists") {
		t.Errorf("existing output: %v", err)
	}
	if err := app(&out).Run([]string{"tilert", "convert", "--model-dir", src, "--save-dir", save, "--force"}); err != nil {
		t.Fatalf("--force: %+v", err)
	}
	if m, _ := weights.ReadManifest(save); m == nil || m.MTPLayers != 1 {
		t.Errorf("--force did not replace the output")
	}

	os.Remove(filepath.Join(save, "tokenizer.json"))
	err = app(&out).Run([]string{"tilert", "convert", "--verify", save})
	if err == nil || !strings.Contains(err.Error(), "tokenizer.json") {
		t.Errorf("verify of a damaged directory: %v", err)
	}
	err = app(&out).Run([]string{"tilert", "convert", "--model-dir", src})
	if err == nil || !strings.Contains(err.Error(), "--save-dir") {
		t.Errorf("missing --save-dir: %v", err)
	}
}
