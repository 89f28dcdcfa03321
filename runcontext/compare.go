package runcontext

import (
	"strings"

	"github.com/ctxd/ctxd"
)

// Compare reports where cur stops extending prev, the previous prompt of
// the same session followed by its answer as the format renders it
// (Format.Answer). It returns nil when cur extends prev. It compares block
// by block and copies nothing: the stable blocks of two requests usually
// share memory.
func Compare(prev, cur Rendered, answer string) *ctxd.PrefixBreak {
	for k := range BlockState {
		if prev.Blocks[k] != cur.Blocks[k] {
			name := BlockNames[k]
			return &ctxd.PrefixBreak{Block: name, Reason: name + " block changed"}
		}
	}
	// The previous query and answer belong in the state now, so the new
	// state must start with the old state, the old query and the answer.
	st := cur.Blocks[BlockState]
	for _, part := range []string{prev.Blocks[BlockState], prev.Blocks[BlockQuery], answer} {
		if !strings.HasPrefix(st, part) {
			return &ctxd.PrefixBreak{Block: BlockNames[BlockState], Reason: "conversation was compacted or rewritten"}
		}
		st = st[len(part):]
	}
	return nil
}
