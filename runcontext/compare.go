package runcontext

import (
	"strings"

	"github.com/ctxd/ctxd"
)

// Compare reports where cur stops extending prev, the previous prompt of
// the same session followed by its answer as the format renders it
// (Format.Answer). It returns nil when cur extends prev. It compares block
// by block and copies nothing: the stable blocks of two requests usually
// share memory. When a block's artifacts changed, the reason names the
// formatter whose text changed first.
func Compare(prev, cur Rendered, answer string) *ctxd.PrefixBreak {
	for k := range BlockState {
		if prev.Blocks[k] != cur.Blocks[k] {
			name := BlockNames[k]
			reason := name + " block changed"
			if f := changedArtifact(prev.Artifacts, cur.Artifacts, k); f != "" {
				reason += ": the text formatter " + f + " injects changed"
			}
			return &ctxd.PrefixBreak{Block: name, Reason: reason}
		}
	}
	// The previous query and answer belong in the state now, so the new
	// state must start with the old state, the old query and the answer.
	st := cur.Blocks[BlockState]
	for i, part := range []string{prev.Blocks[BlockState], prev.Blocks[BlockQuery], answer} {
		if !strings.HasPrefix(st, part) {
			reason := "conversation was compacted or rewritten"
			if f := volatileFormatters(prev.Artifacts); i == 1 && f != "" {
				reason = "the previous query held volatile text (" + f + "), which the conversation does not keep"
			}
			return &ctxd.PrefixBreak{Block: BlockNames[BlockState], Reason: reason}
		}
		st = st[len(part):]
	}
	return nil
}

// changedArtifact names the formatter of the first artifact rendered in
// block k that differs between prev and cur, or is in one only; "" if the
// block's artifacts are the same.
func changedArtifact(prev, cur []Artifact, k int) string {
	p, c := inBlock(prev, k), inBlock(cur, k)
	for i := range max(len(p), len(c)) {
		switch {
		case i >= len(p):
			return c[i].Formatter
		case i >= len(c):
			return p[i].Formatter
		case p[i].Formatter != c[i].Formatter:
			return min(p[i].Formatter, c[i].Formatter)
		case p[i].Text != c[i].Text:
			return p[i].Formatter
		}
	}
	return ""
}

// inBlock is the artifacts of arts that render in block k, in order.
func inBlock(arts []Artifact, k int) []Artifact {
	var out []Artifact
	for _, a := range arts {
		if b, ok := a.renderBlock(); ok && b == k {
			out = append(out, a)
		}
	}
	return out
}

// volatileFormatters names the formatters of the volatile artifacts in
// arts, comma-separated, each once.
func volatileFormatters(arts []Artifact) string {
	var names []string
	for _, a := range inBlock(arts, BlockQuery) {
		if len(names) == 0 || names[len(names)-1] != a.Formatter {
			names = append(names, a.Formatter)
		}
	}
	return strings.Join(names, ", ")
}
