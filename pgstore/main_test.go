package pgstore

import (
	"testing"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/internal/pgtest"
	"github.com/ctxd/ctxd/internal/storetest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// openTest opens a store on a fresh database of the shared cluster,
// closed when tb ends.
func openTest(tb testing.TB) *Store {
	tb.Helper()
	return openURL(tb, pgtest.NewDatabase(tb), OpenOptions{})
}

// openURL opens a store on url, closed when tb ends.
func openURL(tb testing.TB, url string, o OpenOptions) *Store {
	tb.Helper()
	s, err := OpenWith(tb.Context(), url, o)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { s.Close() })
	return s
}

func TestKarmaContract(t *testing.T) {
	storetest.Karma(t, func(tb testing.TB) ctxd.KarmaStore { return openTest(tb) })
}

func TestSessionContract(t *testing.T) {
	storetest.Sessions(t, func(tb testing.TB) ctxd.Store { return openTest(tb) })
}
