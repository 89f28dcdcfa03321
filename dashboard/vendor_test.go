package dashboard

import (
	"bytes"
	"encoding/json"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestVendoredUPlotIsThePinnedOne: the chart library embedded in the page
// is the version package-lock.json pins, byte for byte the npm package's
// files where node_modules is installed (make test installs it; `make
// dashboard-vendor` copies them in again after the pin moves).
func TestVendoredUPlotIsThePinnedOne(t *testing.T) {
	var lock struct {
		Packages map[string]struct {
			Version   string `json:"version"`
			Integrity string `json:"integrity"`
		} `json:"packages"`
	}
	b, err := os.ReadFile("package-lock.json")
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &lock); err != nil {
		t.Fatal(err)
	}
	pin := lock.Packages["node_modules/uplot"]
	if pin.Version == "" || !strings.HasPrefix(pin.Integrity, "sha512-") {
		t.Fatalf("package-lock.json pins no uplot with its integrity: %+v", pin)
	}
	vendored, err := fs.ReadFile(Page(), "vendor/uPlot.esm.js")
	if err != nil {
		t.Fatal(err)
	}
	if head := vendored[:min(len(vendored), 400)]; !bytes.Contains(head, []byte("(v"+pin.Version+")")) {
		t.Fatalf("the embedded uPlot is not v%s: %q", pin.Version, head)
	}
	dist := filepath.Join("node_modules", "uplot", "dist")
	if _, err := os.Stat(dist); err != nil {
		msg := "node_modules/uplot is not installed (make test runs npm ci in dashboard/): " + err.Error()
		if os.Getenv("CTXD_REQUIRE_NODE") != "" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	for name, from := range map[string]string{
		"vendor/uPlot.esm.js": filepath.Join(dist, "uPlot.esm.js"), "vendor/uPlot.min.css": filepath.Join(dist, "uPlot.min.css"),
		"vendor/LICENSE": filepath.Join("node_modules", "uplot", "LICENSE"),
	} {
		want, err := os.ReadFile(from)
		if err != nil {
			t.Fatal(err)
		}
		got, err := fs.ReadFile(Page(), name)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("web/%s differs from %s: run `make dashboard-vendor`", name, from)
		}
	}
}
