package systemd

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
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
	state := filepath.Join(dir, "state 100%", "ctxd")
	paths, err := Write(filepath.Join(dir, "units"), Options{Binary: bin, Config: cfg, Writable: []string{state}})
	if err != nil {
		t.Fatal(err)
	}
	service, _ := os.ReadFile(paths[0])
	for _, want := range []string{
		`ExecStart="` + bin + `" serve --config "` + filepath.Join(dir, "my config%%.toml") + `"`,
		`ReadWritePaths=-%t/ctxd "` + filepath.Join(dir, "state 100%%", "ctxd") + `"`,
		"Type=notify", "WatchdogSec=30s", "NoNewPrivileges=yes", "ProtectSystem=strict", "ProtectHome=read-only", "PrivateTmp=yes",
	} {
		if !strings.Contains(string(service), want+"\n") {
			t.Errorf("service unit:\n%s\nwant the line %s", service, want)
		}
	}
	if strings.Contains(string(service), "PrivateNetwork") {
		t.Errorf("PrivateNetwork without being asked:\n%s", service)
	}
	private, err := Render("ctxd.service", Options{Binary: bin, PrivateNetwork: true})
	if err != nil || !strings.Contains(string(private), "\nPrivateNetwork=yes\n") {
		t.Errorf("a service with a network of its own: %v\n%s", err, private)
	}
	// systemd makes only existing directories writable: Write made it.
	if fi, err := os.Stat(state); err != nil || !fi.IsDir() || fi.Mode().Perm() != 0o700 {
		t.Errorf("state directory: %v %v, want a directory of mode 0700", fi, err)
	}
	if _, err := Render("ctxd.service", Options{Binary: "ctxd"}); err == nil {
		t.Error("a relative binary path was accepted")
	}
	if _, err := Render("ctxd.service", Options{Binary: bin, Writable: []string{"state"}}); err == nil {
		t.Error("a relative writable directory was accepted")
	}
	// PrivateTmp=yes: the service has a /tmp of its own.
	if got := Hidden("/tmp/ctxd.toml", "/var/tmp/m.gguf", "/home/u/tmp/x", "/tmpfoo", "/srv/codex"); !slices.Equal(got, []string{"/tmp/ctxd.toml", "/var/tmp/m.gguf"}) {
		t.Errorf("Hidden: %q", got)
	}
}

// TestUnitsPassSystemdAnalyze has systemd check the units as written for
// a real binary (this test's) and config, and checks that the check can
// fail: a directive systemd would ignore is reported.
// CTXD_REQUIRE_SYSTEMD=1 (make test) turns the skip without
// systemd-analyze into a failure.
func TestUnitsPassSystemdAnalyze(t *testing.T) {
	t.Parallel()
	needAnalyzer(t)
	dir := t.TempDir()
	bin, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(dir, "ctxd.toml")
	if err := os.WriteFile(cfg, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	paths, err := Write(filepath.Join(dir, "units"), Options{Binary: bin, Config: cfg, Writable: []string{filepath.Join(dir, "state")}, PrivateNetwork: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := Verify(t.Context(), nil, paths...); err != nil {
		t.Error(err)
	}

	// The same service with a value systemd ignores (it still exits 0).
	service, err := os.ReadFile(paths[0])
	if err != nil {
		t.Fatal(err)
	}
	bad := strings.Replace(string(service), "ProtectSystem=strict", "ProtectSystem=stricter", 1)
	badDir := filepath.Join(dir, "bad")
	if err := os.MkdirAll(badDir, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, text := range map[string]string{"ctxd.service": bad, "ctxd.socket": ""} {
		if text == "" {
			b, _ := os.ReadFile(paths[1])
			text = string(b)
		}
		if err := os.WriteFile(filepath.Join(badDir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	err = Verify(t.Context(), nil, filepath.Join(badDir, "ctxd.socket"), filepath.Join(badDir, "ctxd.service"))
	if err == nil || !strings.Contains(err.Error(), "stricter") {
		t.Errorf("a unit with ProtectSystem=stricter passed the check: %v", err)
	}

	// How exposed systemd judges the service (reported, not asserted:
	// the score's scale is systemd's and changes between its versions).
	sec := exec.Command("systemd-analyze", "security", "--offline=yes", "--user", "--no-pager", paths[0])
	sec.Env = append(os.Environ(), "XDG_RUNTIME_DIR="+t.TempDir())
	if out, err := sec.CombinedOutput(); err == nil {
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		t.Logf("systemd-analyze security: %s", lines[len(lines)-1])
	}
}

// needAnalyzer skips without systemd-analyze, unless CTXD_REQUIRE_SYSTEMD=1
// says the units must be checked (make test installs it first).
func needAnalyzer(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("systemd-analyze"); err != nil {
		if os.Getenv("CTXD_REQUIRE_SYSTEMD") == "1" {
			t.Fatalf("CTXD_REQUIRE_SYSTEMD=1 but %v; scripts/ensure-systemd.sh installs it", errors.Join(err, ErrNoAnalyzer))
		}
		t.Skipf("%v: the units were not checked by systemd (CTXD_REQUIRE_SYSTEMD=1 makes this a failure)", ErrNoAnalyzer)
	}
}
