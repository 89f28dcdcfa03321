package systemd

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

func TestUnitsRunThisBinaryWithItsConfig(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	bin, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(dir, "my config%.toml")
	paths, err := Write(filepath.Join(dir, "units"), Options{Binary: bin, Config: cfg})
	if err != nil {
		t.Fatal(err)
	}
	service, _ := os.ReadFile(paths[0])
	want := `ExecStart="` + bin + `" serve --config "` + filepath.Join(dir, "my config%%.toml") + `"`
	if !strings.Contains(string(service), want+"\n") || !strings.Contains(string(service), "Type=notify") {
		t.Errorf("service unit:\n%s\nwant the line %s", service, want)
	}
	if _, err := Render("ctxd.service", Options{Binary: "ctxd"}); err == nil {
		t.Error("a relative binary path was accepted")
	}
	// systemd's own check, where systemd is installed.
	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Skip("systemd-analyze not installed: the units were not checked by systemd")
	}
	cmd := exec.Command(analyze, "verify", "--user", paths[1], paths[0])
	cmd.Env = append(os.Environ(), "XDG_RUNTIME_DIR="+t.TempDir())
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("systemd-analyze verify: %v\n%s", err, out)
	}
}
