package main

import (
	"testing"

	"github.com/ctxd/ctxd"
)

func TestOrderLine(t *testing.T) {
	for _, c := range []struct {
		o    ctxd.CodexOrder
		want string
	}{
		{ctxd.CodexOrder{Kind: ctxd.OrderStability, Source: "git history: 12 commits from abc", From: -1},
			"stability, the files that change least first (git history: 12 commits from abc); made at this load"},
		{ctxd.CodexOrder{Kind: ctxd.OrderStability, Source: "modification times", Kept: true, From: 7},
			"stability, the files that change least first (modification times); kept, nothing changed"},
		{ctxd.CodexOrder{Kind: ctxd.OrderPath, Source: "path order", Kept: true, From: 2, Changed: []string{"a.go"}, Removed: []string{"b.go"}},
			"path; kept to file 3, the rest arranged again with 1 changed or new file(s), 1 removed: a.go"},
		{ctxd.CodexOrder{Kind: ctxd.OrderStability, Source: "modification times", Kept: true, From: 0, EditsLast: true, Changed: []string{"a.go"}},
			"stability, the files that change least first (modification times); kept to file 1, then the others in their order and the 1 changed or new file(s) at the end (backend.cache_reuse): a.go"},
	} {
		if got := orderLine(c.o); got != c.want {
			t.Errorf("orderLine(%+v)\n got %q\nwant %q", c.o, got, c.want)
		}
	}
}
