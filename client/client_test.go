package client

import (
	"os/exec"
	"strings"
	"testing"
)

// TestClientLinksNoHeavyDependencies: a program that talks to ctxd links
// the standard library, the domain package, sockowner (the socket's peer
// check: standard library only) and the WebSocket library (pure Go) only —
// no cgo llama.cpp, no SQLite, no NVML.
func TestClientLinksNoHeavyDependencies(t *testing.T) {
	t.Parallel()
	out, err := exec.Command("go", "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}} {{len .CgoFiles}}{{end}}", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		path, cgo, _ := strings.Cut(line, " ")
		switch {
		case path == "github.com/ctxd/ctxd" || path == "github.com/ctxd/ctxd/client" || path == "github.com/ctxd/ctxd/sockowner":
		case path == "github.com/coder/websocket" || strings.HasPrefix(path, "github.com/coder/websocket/internal/"):
		default:
			t.Errorf("client depends on %s", path)
		}
		if cgo != "0" {
			t.Errorf("%s has cgo files", path)
		}
	}
}
