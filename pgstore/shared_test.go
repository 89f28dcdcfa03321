package pgstore

import (
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/internal/pgtest"
	"github.com/ctxd/ctxd/internal/storetest"
)

// TestTwoStoresShareOneDatabase: two Stores on one database, as two
// daemons: what one writes the other reads, and their concurrent appends
// to one session never share a seq.
func TestTwoStoresShareOneDatabase(t *testing.T) {
	ctx := t.Context()
	url := pgtest.NewDatabase(t)
	a, b := openURL(t, url, OpenOptions{}), openURL(t, url, OpenOptions{})

	if _, err := a.AppendTurn(ctx, "s", ctxd.Turn{Query: "q1", Answer: "a1"}, nil, storetest.T0); err != nil {
		t.Fatal(err)
	}
	if sess, err := b.Session(ctx, "s"); err != nil || len(sess.Turns) != 1 || sess.Turns[0].Query != "q1" {
		t.Fatalf("the other store reads %+v, %v", sess, err)
	}
	if seq, err := b.AppendTurn(ctx, "s", ctxd.Turn{Query: "q2", Answer: "a2"}, nil, storetest.T0); err != nil || seq != 2 {
		t.Fatalf("the other store appends: seq %d, %v; want 2", seq, err)
	}
	if sess, err := a.Session(ctx, "s"); err != nil || !slices.Equal(sess.Seqs, []int64{1, 2}) {
		t.Fatalf("the first store reads %+v, %v", sess, err)
	}

	id := storetest.Record(t, a, "dev", "q", storetest.T0)
	storetest.Event(t, b, ctxd.KarmaEvent{Trace: id, Action: ctxd.KarmaVerify, At: storetest.T0})
	if el, err := a.Eligible(ctx, "dev"); err != nil || len(el) != 1 || el[0].ID != id {
		t.Errorf("a verification through the other store: eligible %+v, %v", el, err)
	}

	const writers, rounds = 8, 10
	seqs := make([][]int64, writers)
	errs := make([]error, writers)
	var wg sync.WaitGroup
	for w := range writers {
		s := []*Store{a, b}[w%2]
		wg.Go(func() {
			for r := range rounds {
				seq, err := s.AppendTurn(ctx, "busy", ctxd.Turn{Query: fmt.Sprintf("w%d r%d", w, r)}, nil, storetest.T0)
				if err != nil {
					errs[w] = err
					return
				}
				seqs[w] = append(seqs[w], seq)
			}
		})
	}
	wg.Wait()
	var all []int64
	for w, err := range errs {
		if err != nil {
			t.Fatalf("writer %d: %v", w, err)
		}
		all = append(all, seqs[w]...)
	}
	slices.Sort(all)
	for i, seq := range all {
		if seq != int64(i+1) {
			t.Fatalf("seqs given through both stores: %v; want 1 to %d, each once", all, writers*rounds)
		}
	}
	if sess, err := b.Session(ctx, "busy"); err != nil || len(sess.Turns) != writers*rounds {
		t.Errorf("the session holds %d turns, %v; want %d", len(sess.Turns), err, writers*rounds)
	}

	owners := make([]string, 2)
	for i, s := range []*Store{a, b} {
		wg.Go(func() {
			owners[i], errs[i] = s.ClaimSession(ctx, "claimed", fmt.Sprint("sigil", i), "default", storetest.T0)
		})
	}
	wg.Wait()
	if errs[0] != nil || errs[1] != nil || owners[0] != owners[1] || owners[0] == "" {
		t.Errorf("claims through both stores: owners %q, errors %v %v; want one owner", owners, errs[0], errs[1])
	}
}

func TestOpenOptions(t *testing.T) {
	url := pgtest.NewDatabase(t)
	if s := openURL(t, url, OpenOptions{MaxConns: 3}); s.pool.Config().MaxConns != 3 {
		t.Errorf("MaxConns 3: the pool holds %d", s.pool.Config().MaxConns)
	}
	if s := openURL(t, url+"&pool_max_conns=5", OpenOptions{}); s.pool.Config().MaxConns != 5 {
		t.Errorf("pool_max_conns=5: the pool holds %d", s.pool.Config().MaxConns)
	}
	if s := openURL(t, url+"&pool_max_conns=5", OpenOptions{MaxConns: 2}); s.pool.Config().MaxConns != 2 {
		t.Errorf("MaxConns 2 over pool_max_conns=5: the pool holds %d", s.pool.Config().MaxConns)
	}
	if _, err := OpenWith(t.Context(), url, OpenOptions{MaxConns: -1}); err == nil {
		t.Error("a negative MaxConns was taken")
	}
	if s := openURL(t, pgtest.Server(t).SocketURL(dbOf(t, url)), OpenOptions{}); s.Name() != fmt.Sprintf("postgres://postgres@/%s?host=%s&port=%d", dbOf(t, url), pgtest.Server(t).SocketDir(), pgtest.Server(t).Port()) {
		t.Errorf("a store over the socket is named %s", s.Name())
	}
}

func dbOf(t *testing.T, url string) string {
	t.Helper()
	cfg, err := pgconn.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	return cfg.Database
}

// TestSessionOwner: the owner alone, "" for a session never begun.
func TestSessionOwner(t *testing.T) {
	s := openTest(t)
	ctx := t.Context()
	if owner, err := s.SessionOwner(ctx, "none"); err != nil || owner != "" {
		t.Fatalf("unknown session: %q %v", owner, err)
	}
	if _, err := s.ClaimSession(ctx, "mine", "alice", "default", time.Unix(1700000000, 0)); err != nil {
		t.Fatal(err)
	}
	if owner, err := s.SessionOwner(ctx, "mine"); err != nil || owner != "alice" {
		t.Errorf("claimed session: %q %v, want alice", owner, err)
	}
}
