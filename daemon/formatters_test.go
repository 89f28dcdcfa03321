package daemon

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/formatters"
	"github.com/ctxd/ctxd/formatters/standard"
	"github.com/ctxd/ctxd/internal/daemontest"
	"github.com/ctxd/ctxd/runcontext"
)

// styleGuide is an extension: a stable identity-block injector.
type styleGuide struct{}

func (styleGuide) Name() string { return "styleguide" }
func (styleGuide) Block() int   { return runcontext.BlockIdentity }
func (styleGuide) Stable() bool { return true }
func (styleGuide) Inject(context.Context, formatters.Input) (string, error) {
	return "style: answer in one sentence.", nil
}

// ticker is an extension: a volatile injector whose text changes on every
// request.
type ticker struct{ n atomic.Int64 }

func (*ticker) Name() string { return "ticker" }
func (*ticker) Block() int   { return runcontext.BlockQuery }
func (*ticker) Stable() bool { return false }
func (t *ticker) Inject(context.Context, formatters.Input) (string, error) {
	return "request number " + string(rune('0'+t.n.Add(1))), nil
}

// TestFormatters: the codex's AGENTS.md is pinned into the identity block
// by the shipped conventions formatter, and extensions registered by the
// embedding program (no core edits) join the prompt: a stable one in its
// block, fingerprinted with the prefix, and a volatile one in the tail
// only, so the blocks before the state keep their bytes from turn to turn.
func TestFormatters(t *testing.T) {
	t.Parallel()
	reg := standard.Default(standard.Options{})
	for _, inj := range []formatters.Injector{styleGuide{}, &ticker{}} {
		if err := reg.Register(inj); err != nil {
			t.Fatal(err)
		}
	}
	f := newFixture(t, fixtureOptions{formatters: reg})
	dir := daemontest.SmallCodex(t)
	if err := os.WriteFile(filepath.Join(dir, "AGENTS.md"), []byte("Run `make test` before every commit.\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := f.client.LoadCodex(t.Context(), dir, nil); err != nil {
		t.Fatal(err)
	}
	f.ask(t, "fm", "first")
	lp1, err := f.client.LastPrompt(t.Context(), "fm")
	if err != nil {
		t.Fatal(err)
	}
	block := func(lp *ctxd.LastPrompt, i int) string {
		b := lp.Blocks[i]
		return lp.Prompt[b.Offset : b.Offset+b.Bytes]
	}
	identity := block(lp1, 0)
	if !strings.Contains(identity, "project conventions (AGENTS.md):\nRun `make test` before every commit.") || !strings.Contains(identity, "style: answer in one sentence.") {
		t.Errorf("identity block:\n%s", identity)
	}
	sum := f.ask(t, "fm", "second")
	lp2, err := f.client.LastPrompt(t.Context(), "fm")
	if err != nil {
		t.Fatal(err)
	}
	query := block(lp2, len(lp2.Blocks)-1)
	if !strings.Contains(query, "request number") || strings.Count(lp2.Prompt, "request number") != 1 {
		t.Errorf("the volatile artifact: query block %q", query)
	}
	// The history does not keep a volatile artifact: the previous query
	// is re-evaluated, and the break says which formatter caused it.
	if b := sum.PrefixBreak; b == nil || b.Block != "state" || !strings.Contains(b.Reason, "ticker") {
		t.Errorf("turn 2 break %+v", b)
	}
	for i := range 5 { // identity to karma keep their bytes
		if block(lp1, i) != block(lp2, i) {
			t.Errorf("block %s changed between turns", lp1.Blocks[i].Name)
		}
	}
	if sum.CachedTokens == 0 {
		t.Errorf("turn 2 reused nothing: %+v", sum)
	}
}
