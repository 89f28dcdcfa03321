package storetest

import (
	"fmt"
	"slices"
	"sync"
	"testing"

	"github.com/ctxd/ctxd"
)

// Writers and rounds of the concurrency cases: enough goroutines to keep
// every connection of a pool busy and queue more behind them.
const (
	writers = 12
	rounds  = 5
)

// concurrencyCases are the session contract under concurrent writes: the
// store arbitrates, so that no two writes get one sequence number, no
// turn is lost and a session has one owner.
var concurrencyCases = []struct {
	name string
	run  func(t *testing.T, s ctxd.Store)
}{
	{"concurrent appends", func(t *testing.T, s ctxd.Store) {
		ctx := t.Context()
		appendTurn(t, s, "shared", ctxd.Turn{Query: "first", Answer: "a"})
		seqOf := make([][]int64, writers) // by writer, by round
		errs := make([]error, writers)
		start := make(chan struct{})
		var wg sync.WaitGroup
		for w := range writers {
			wg.Go(func() {
				<-start
				for r := range rounds {
					seq, err := s.AppendTurn(ctx, "shared", ctxd.Turn{Query: fmt.Sprintf("w%d r%d", w, r), Answer: "a"}, nil, T0)
					if err != nil {
						errs[w] = err
						return
					}
					seqOf[w] = append(seqOf[w], seq)
				}
			})
		}
		close(start)
		wg.Wait()
		for w, err := range errs {
			if err != nil {
				t.Fatalf("writer %d: %v", w, err)
			}
		}
		sess := session(t, s, "shared")
		const n = 1 + writers*rounds
		if len(sess.Turns) != n || sess.Count != n {
			t.Fatalf("%d turns (%d in the record) after %d appends", len(sess.Turns), sess.Count, n)
		}
		want := make([]int64, n)
		for i := range want {
			want[i] = int64(i + 1)
		}
		if !slices.Equal(sess.Seqs, want) {
			t.Fatalf("seqs %v, want 1 to %d", sess.Seqs, n)
		}
		byQuery := map[string]int64{}
		for i, tr := range sess.Turns {
			byQuery[tr.Query] = sess.Seqs[i]
		}
		for w := range writers {
			for r, seq := range seqOf[w] {
				if q := fmt.Sprintf("w%d r%d", w, r); byQuery[q] != seq {
					t.Errorf("turn %q was given seq %d, is stored at %d", q, seq, byQuery[q])
				}
			}
		}
	}},
	{"concurrent claims", func(t *testing.T, s ctxd.Store) {
		ctx := t.Context()
		for i := range 10 {
			id := fmt.Sprint("contested-", i)
			sigils := []string{"alpha", "beta", "gamma"}
			owners := make([]string, len(sigils))
			errs := make([]error, len(sigils))
			start := make(chan struct{})
			var wg sync.WaitGroup
			for j, sigil := range sigils {
				wg.Go(func() {
					<-start
					owners[j], errs[j] = s.ClaimSession(ctx, id, sigil, "default", T0)
				})
			}
			close(start)
			wg.Wait()
			for j, err := range errs {
				if err != nil {
					t.Fatalf("%s claiming %s: %v", sigils[j], id, err)
				}
			}
			if !slices.Contains(sigils, owners[0]) || slices.ContainsFunc(owners, func(o string) bool { return o != owners[0] }) {
				t.Errorf("%s: the claims were told %q; want one owner, told to all", id, owners)
			}
			if got := session(t, s, id).Owner; got != owners[0] {
				t.Errorf("%s is owned by %q; the claims were told %q", id, got, owners[0])
			}
		}
	}},
	{"concurrent writes of every kind", func(t *testing.T, s ctxd.Store) {
		// Appends beside new epochs, dropped excerpts and replaced turns:
		// every write that returned holds, and no seq is given twice.
		ctx := t.Context()
		var mu sync.Mutex
		given := map[int64]string{} // seq: by whom
		give := func(seq int64, who string) {
			mu.Lock()
			defer mu.Unlock()
			if by, dup := given[seq]; dup {
				t.Errorf("seq %d given to %s and to %s", seq, by, who)
			}
			given[seq] = who
		}
		var wg sync.WaitGroup
		errs := make(chan error, writers*rounds)
		for w := range writers {
			wg.Go(func() {
				for r := range rounds {
					who := fmt.Sprintf("w%d r%d", w, r)
					switch (w + r) % 4 {
					case 0, 1:
						seq, err := s.AppendTurn(ctx, "mixed", ctxd.Turn{Query: who, Answer: "a"}, nil, T0)
						if err != nil {
							errs <- err
							continue
						}
						give(seq, who)
					case 2:
						if _, err := s.DropExcerpts(ctx, "mixed", nil, T0); err != nil {
							errs <- err
						}
					case 3:
						_, seqs, err := s.ReplaceTurns(ctx, "mixed", []ctxd.Turn{{Query: who, Answer: "r"}}, T0)
						if err != nil {
							errs <- err
							continue
						}
						give(seqs[0], who)
					}
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
		if sess := session(t, s, "mixed"); sess.Count != len(given) {
			t.Errorf("the record holds %d turns; %d were written", sess.Count, len(given))
		}
	}},
}
