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
}

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
	t, err := template.New(name).Parse(string(text))
	if err != nil {
		return nil, fmt.Errorf("systemd: %w", err)
	}
	var b bytes.Buffer
	if err := t.Execute(&b, map[string]string{"ExecStart": exec}); err != nil {
		return nil, fmt.Errorf("systemd: %w", err)
	}
	return b.Bytes(), nil
}

// Write writes every unit into dir and returns their paths.
func Write(dir string, o Options) ([]string, error) {
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
