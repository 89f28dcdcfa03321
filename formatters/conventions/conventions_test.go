package conventions_test

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/ctxd/ctxd/formatters"
	"github.com/ctxd/ctxd/formatters/conventions"
	"github.com/ctxd/ctxd/runcontext"
)

// codex is a fake loaded codex: files by path, and how often each was read.
type codex struct {
	mu    sync.Mutex
	files map[string]string
	fail  error // every read fails with it, when set
	reads map[string]int
}

func (c *codex) file(path string) (string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.reads == nil {
		c.reads = map[string]int{}
	}
	c.reads[path]++
	if c.fail != nil {
		return "", c.fail
	}
	s, ok := c.files[path]
	if !ok {
		return "", fmt.Errorf("codex: %s: %w", path, fs.ErrNotExist)
	}
	return s, nil
}

func inject(t *testing.T, inj *conventions.Injector, c *codex, fingerprint string) string {
	t.Helper()
	in := formatters.Input{RunContext: &runcontext.RunContext{}, CodexFingerprint: fingerprint}
	if c != nil {
		in.CodexFile = c.file
	}
	text, err := inj.Inject(t.Context(), in)
	if err != nil {
		t.Fatal(err)
	}
	return text
}

func TestFirstFileFound(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		files map[string]string
		want  string
	}{
		{"none", map[string]string{"README.md": "# x"}, ""},
		{"agents first", map[string]string{"AGENTS.md": "Run make test.\n\n", "CONTRIBUTING.md": "PRs welcome."},
			"\nproject conventions (AGENTS.md):\nRun make test.\n"},
		{"conventions before contributing", map[string]string{"CONVENTIONS.md": "Tabs.", "CONTRIBUTING.md": "PRs."},
			"\nproject conventions (CONVENTIONS.md):\nTabs.\n"},
		{"github's", map[string]string{".github/CONTRIBUTING.md": "Sign off."},
			"\nproject conventions (.github/CONTRIBUTING.md):\nSign off.\n"},
		{"a blank file counts as none", map[string]string{"AGENTS.md": " \n", "CONTRIBUTING.md": "PRs."},
			"\nproject conventions (CONTRIBUTING.md):\nPRs.\n"},
		{"only at the root", map[string]string{"docs/AGENTS.md": "no"}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := inject(t, conventions.New(conventions.Options{}), &codex{files: tc.files}, "fp"); got != tc.want {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
	if got := inject(t, conventions.New(conventions.Options{}), nil, ""); got != "" {
		t.Errorf("no codex: %q", got)
	}
}

// TestTooLarge: a file over the cap is named with its size, not cut
// short; the note and the log say so, once.
func TestTooLarge(t *testing.T) {
	t.Parallel()
	var log bytes.Buffer
	inj := conventions.New(conventions.Options{MaxBytes: 10, Logger: slog.New(slog.NewTextHandler(&log, nil))})
	c := &codex{files: map[string]string{"AGENTS.md": strings.Repeat("x", 11), "CONTRIBUTING.md": "small"}}
	want := "\nproject conventions: AGENTS.md is 11 bytes, over the 10-byte limit, and is not included.\n"
	for _, fp := range []string{"a", "b"} {
		if got := inject(t, inj, c, fp); got != want {
			t.Errorf("got %q, want %q", got, want)
		}
	}
	if n := strings.Count(log.String(), "conventions file not pinned"); n != 1 || !strings.Contains(inj.Note(), "AGENTS.md is 11 bytes, over the 10-byte cap") {
		t.Errorf("logged %d times; note %q; log:\n%s", n, inj.Note(), log.String())
	}
	c.files["AGENTS.md"] = "short"
	if got := inject(t, inj, c, "c"); !strings.Contains(got, "short") || inj.Note() != "" {
		t.Errorf("after the file shrank: %q, note %q", got, inj.Note())
	}
	c.files["AGENTS.md"] = "\xff\xfe"
	if got := inject(t, inj, c, "d"); got != "" || !strings.Contains(inj.Note(), "not UTF-8") {
		t.Errorf("a binary file: %q, note %q", got, inj.Note())
	}
}

// TestReadsOncePerCodexVersion: the codex is read again only when its
// fingerprint changes, or when there is none to cache on.
func TestReadsOncePerCodexVersion(t *testing.T) {
	t.Parallel()
	inj := conventions.New(conventions.Options{})
	c := &codex{files: map[string]string{"AGENTS.md": "v1"}}
	for range 3 {
		inject(t, inj, c, "fp1")
	}
	if c.reads["AGENTS.md"] != 1 {
		t.Errorf("read %d times for one codex version", c.reads["AGENTS.md"])
	}
	c.files["AGENTS.md"] = "v2"
	if got := inject(t, inj, c, "fp2"); !strings.Contains(got, "v2") || c.reads["AGENTS.md"] != 2 {
		t.Errorf("a new codex version: %q, %d reads", got, c.reads["AGENTS.md"])
	}
	inject(t, inj, c, "")
	inject(t, inj, c, "")
	if c.reads["AGENTS.md"] != 4 {
		t.Errorf("without a fingerprint: %d reads, want one per request", c.reads["AGENTS.md"])
	}
}

// An error other than the file's absence is not remembered, and the last
// text read stands meanwhile (the identity block does not flicker).
func TestReadError(t *testing.T) {
	t.Parallel()
	inj := conventions.New(conventions.Options{})
	c := &codex{files: map[string]string{"AGENTS.md": "v1"}, fail: errors.New("disk on fire")}
	if got := inject(t, inj, c, "fp"); got != "" {
		t.Fatalf("a failed first read: %q", got)
	}
	c.fail = nil
	if got := inject(t, inj, c, "fp"); !strings.Contains(got, "v1") {
		t.Errorf("after the error: %q", got)
	}
	c.files["AGENTS.md"] = "v2"
	c.fail = errors.New("changed since the load")
	if got := inject(t, inj, c, "fp2"); !strings.Contains(got, "v1") {
		t.Errorf("a failed read of a new codex version: %q, want the last text read", got)
	}
	c.fail = nil
	if got := inject(t, inj, c, "fp2"); !strings.Contains(got, "v2") {
		t.Errorf("the next read: %q", got)
	}
}

// TestPinnedInTheIdentityBlock: applied and rendered, the file is in the
// identity block, after the persona, with its ### lines escaped.
func TestPinnedInTheIdentityBlock(t *testing.T) {
	t.Parallel()
	reg := formatters.NewRegistry()
	if err := reg.Register(conventions.New(conventions.Options{})); err != nil {
		t.Fatal(err)
	}
	rc := &runcontext.RunContext{
		Identity:    runcontext.Identity{Name: "ctxd", Persona: "Be careful."},
		Codex:       runcontext.Codex{Mode: runcontext.ModeNone},
		Environment: runcontext.Environment{VRAM: "low", GPU: "none", Power: "ac", Connectivity: "online"},
		Sigil:       runcontext.Sigil{Name: "default", Scopes: []string{"ask"}},
		Query:       runcontext.Query{Text: "q"},
	}
	c := &codex{files: map[string]string{"AGENTS.md": "### Build\nmake test\n"}}
	arts, err := reg.Apply(t.Context(), formatters.Input{RunContext: rc, CodexFile: c.file, CodexFingerprint: "fp"})
	if err != nil {
		t.Fatal(err)
	}
	rc.Artifacts = arts
	if err := rc.Validate(); err != nil {
		t.Fatal(err)
	}
	want := "### IDENTITY ctxd\nBe careful.\n\nproject conventions (AGENTS.md):\n\\### Build\nmake test\n\n"
	if got := runcontext.Render(rc).Blocks[runcontext.BlockIdentity]; got != want {
		t.Errorf("identity block:\n%q\nwant\n%q", got, want)
	}
}
