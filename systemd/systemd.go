package systemd

import (
	"bytes"
	"embed"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"text/template"
)

//go:embed ctxd.service ctxd.socket
var units embed.FS

// Names lists the unit files Write writes.
var Names = []string{"ctxd.service", "ctxd.socket"}

// Options say what the service runs.
type Options struct {
	Binary string // absolute path of the ctxd binary
	Config string // absolute path of its config file; "" for the built-in defaults
	// Writable are the absolute directories the service writes besides
	// its socket's: the config's state directory. The rest of the system
	// and $HOME are read-only to it (ProtectSystem=strict,
	// ProtectHome=read-only), so a directory left out here cannot be
	// written, and one that does not exist cannot be made: Write creates
	// them.
	Writable []string
	// PrivateNetwork gives the service a network namespace of its own
	// (PrivateNetwork=yes): for a config with no TCP listener and a
	// managed backend, which then only ctxd can reach.
	PrivateNetwork bool
}

// runtimeDir is the socket unit's directory (ListenStream=%t/ctxd/...):
// writable when it exists, so a service started without the socket unit
// can make its socket.
const runtimeDir = "-%t/ctxd"

// Render returns the unit file name with the options filled in.
func Render(name string, o Options) ([]byte, error) {
	text, err := units.ReadFile(name)
	if err != nil {
		return nil, fmt.Errorf("systemd: %w", err)
	}
	if !filepath.IsAbs(o.Binary) || o.Config != "" && !filepath.IsAbs(o.Config) {
		return nil, fmt.Errorf("systemd: binary %q and config %q must be absolute paths", o.Binary, o.Config)
	}
	exec := quote(o.Binary) + " serve"
	if o.Config != "" {
		exec += " --config " + quote(o.Config)
	}
	rw := []string{runtimeDir}
	for _, dir := range o.Writable {
		if !filepath.IsAbs(dir) {
			return nil, fmt.Errorf("systemd: writable directory %q must be an absolute path", dir)
		}
		rw = append(rw, quotePath(filepath.Clean(dir)))
	}
	t, err := template.New(name).Parse(string(text))
	if err != nil {
		return nil, fmt.Errorf("systemd: %w", err)
	}
	var b bytes.Buffer
	if err := t.Execute(&b, map[string]any{"ExecStart": exec, "ReadWritePaths": strings.Join(rw, " "), "PrivateNetwork": o.PrivateNetwork}); err != nil {
		return nil, fmt.Errorf("systemd: %w", err)
	}
	return b.Bytes(), nil
}

// Write writes every unit into dir and returns their paths. It creates
// the writable directories (mode 0700) first: systemd makes only existing
// ones writable.
func Write(dir string, o Options) ([]string, error) {
	for _, w := range o.Writable {
		if err := os.MkdirAll(w, 0o700); err != nil {
			return nil, fmt.Errorf("systemd: the service's writable directory: %w", err)
		}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("systemd: %w", err)
	}
	var paths []string
	for _, name := range Names {
		b, err := Render(name, o)
		if err != nil {
			return nil, err
		}
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o644); err != nil {
			return nil, fmt.Errorf("systemd: %w", err)
		}
		paths = append(paths, p)
	}
	return paths, nil
}

// quote quotes a path for ExecStart: double quotes, with backslashes,
// quotes and systemd's % and $ specifiers escaped.
func quote(p string) string {
	r := strings.NewReplacer(`\`, `\\`, `"`, `\"`, `%`, `%%`, `$`, `$$`)
	return `"` + r.Replace(p) + `"`
}

// quotePath quotes a path in a list of paths (ReadWritePaths=): double
// quotes, with backslashes, quotes and % specifiers escaped; $ is not
// expanded there.
func quotePath(p string) string {
	r := strings.NewReplacer(`\`, `\\`, `"`, `\"`, `%`, `%%`)
	return `"` + r.Replace(p) + `"`
}

// Hidden returns the paths the service cannot see: those under /tmp or
// /var/tmp, which PrivateTmp=yes replaces with its own. A config, model,
// codex or state directory there works from a shell and not as the
// service.
func Hidden(paths ...string) []string {
	var hidden []string
	for _, p := range paths {
		for _, tmp := range []string{"/tmp", "/var/tmp"} {
			if p == tmp || strings.HasPrefix(filepath.Clean(p), tmp+"/") {
				hidden = append(hidden, p)
				break
			}
		}
	}
	return hidden
}
