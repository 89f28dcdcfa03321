package systemd

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
)

// ErrNoAnalyzer says systemd-analyze is not installed, so the units could
// not be checked (Debian's systemd package has it).
var ErrNoAnalyzer = errors.New("systemd: systemd-analyze is not installed (Debian: apt-get install systemd)")

// Verify runs systemd's own check of unit files, `systemd-analyze verify
// --user`, and fails on anything it reports: it exits 0 on an unknown key
// or a value it cannot parse (it ignores those lines, and so would the
// service manager), so its output is the verdict, not its exit code. env
// is the environment it runs in (nil: this process's); a user manager
// needs $XDG_RUNTIME_DIR, which Verify points at a scratch directory when
// env has none.
func Verify(ctx context.Context, env []string, paths ...string) error {
	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		return ErrNoAnalyzer
	}
	if env == nil {
		env = os.Environ()
	}
	if !hasRuntimeDir(env) {
		dir, err := os.MkdirTemp("", "ctxd-verify-")
		if err != nil {
			return fmt.Errorf("systemd: verify: %w", err)
		}
		defer os.RemoveAll(dir)
		env = append(env, "XDG_RUNTIME_DIR="+dir)
	}
	cmd := exec.CommandContext(ctx, analyze, append([]string{"verify", "--user", "--man=no"}, paths...)...)
	cmd.Env = env
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err = cmd.Run()
	if msg := strings.TrimSpace(out.String()); err != nil || msg != "" {
		if msg == "" {
			msg = err.Error()
		}
		return fmt.Errorf("systemd: systemd-analyze verify %s:\n%s", strings.Join(paths, " "), msg)
	}
	return nil
}

func hasRuntimeDir(env []string) bool {
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "XDG_RUNTIME_DIR="); ok && v != "" {
			return true
		}
	}
	return false
}
