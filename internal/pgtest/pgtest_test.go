package pgtest

import (
	"context"
	"net/url"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

func TestMain(m *testing.M) { Main(m) }

// execSQL runs stmt on the database at url.
func execSQL(tb testing.TB, url, stmt string, args ...any) error {
	tb.Helper()
	ctx, cancel := context.WithTimeout(tb.Context(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, stmt, args...)
	return err
}

func count(tb testing.TB, url string) int {
	tb.Helper()
	ctx := tb.Context()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		tb.Fatal(err)
	}
	defer conn.Close(ctx)
	var n int
	if err := conn.QueryRow(ctx, "SELECT COUNT(*) FROM t").Scan(&n); err != nil {
		tb.Fatal(err)
	}
	return n
}

// TestSharedServer: one server for the binary, reached over TCP and over
// its socket, running with fsync on, a fresh database per call.
func TestSharedServer(t *testing.T) {
	c := Server(t)
	if Server(t) != c {
		t.Fatal("Server started a second cluster")
	}
	a, b := NewDatabase(t), c.NewDatabase(t)
	if a == b {
		t.Fatalf("two databases at one URL %s", a)
	}
	if err := execSQL(t, a, "CREATE TABLE t (x int)"); err != nil {
		t.Fatal(err)
	}
	if err := execSQL(t, b, "SELECT * FROM t"); err == nil {
		t.Error("a fresh database holds another's table")
	}
	ctx := t.Context()
	conn, err := pgx.Connect(ctx, c.SocketURL(dbName(t, a)))
	if err != nil {
		t.Fatalf("over the socket: %v", err)
	}
	defer conn.Close(ctx)
	var fsync, syncCommit string
	if err := conn.QueryRow(ctx, "SELECT current_setting('fsync'), current_setting('synchronous_commit')").Scan(&fsync, &syncCommit); err != nil || fsync != "on" || syncCommit != "on" {
		t.Errorf("fsync %q, synchronous_commit %q, %v; want on, on", fsync, syncCommit, err)
	}
	var provider string
	if err := conn.QueryRow(ctx, "SELECT datlocprovider FROM pg_database WHERE datname = current_database()").Scan(&provider); err != nil || provider != "i" {
		t.Logf("the database collates by libc (provider %q, %v): this server has no ICU", provider, err)
	}
	if fi, err := os.Stat(c.SocketDir()); err != nil || os.Getuid() == 0 && fi.Sys() != nil && owner(fi) != UID {
		t.Errorf("socket directory %s: %v, owned by %d; want uid %d", c.SocketDir(), err, owner(fi), UID)
	}
}

// TestRestartAndOutage: a private cluster keeps its committed data and
// its port across a fast restart and a crash (immediate stop), and
// refuses connections while stopped.
func TestRestartAndOutage(t *testing.T) {
	c := New(t)
	url := c.NewDatabase(t)
	if err := execSQL(t, url, "CREATE TABLE t (x int)"); err != nil {
		t.Fatal(err)
	}
	if err := execSQL(t, url, "INSERT INTO t VALUES (1)"); err != nil {
		t.Fatal(err)
	}
	port := c.Port()
	c.Restart(t)
	if err := execSQL(t, url, "INSERT INTO t VALUES (2)"); err != nil {
		t.Fatalf("after a restart: %v", err)
	}
	c.Stop(t, Immediate)
	if err := execSQL(t, url, "SELECT 1"); err == nil {
		t.Error("connected to a stopped server")
	}
	c.Start(t)
	if n := count(t, url); n != 2 || c.Port() != port {
		t.Errorf("after a crash: %d rows on port %d; want 2 on %d", n, c.Port(), port)
	}
}

// dbName is the database a URL names.
func dbName(tb testing.TB, raw string) string {
	tb.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		tb.Fatal(err)
	}
	return u.Path[1:]
}

func TestHighestVersionFirst(t *testing.T) {
	got := highestFirst([]string{"/usr/lib/postgresql/9/bin", "/usr/lib/postgresql/15/bin", "/usr/lib/postgresql/13/bin", "/usr/lib/postgresql/x/bin"})
	want := []string{"/usr/lib/postgresql/15/bin", "/usr/lib/postgresql/13/bin", "/usr/lib/postgresql/9/bin", "/usr/lib/postgresql/x/bin"}
	if !slices.Equal(got, want) {
		t.Errorf("order %q, want %q", got, want)
	}
}
