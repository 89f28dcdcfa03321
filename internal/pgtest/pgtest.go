// Package pgtest runs a real PostgreSQL for tests: a private cluster in a
// scratch directory under /tmp, listening on a Unix socket in that
// directory and on a free loopback port, with fsync on (acknowledged
// commits are on disk, as in production), and a fresh database for each
// test that asks (NewDatabase). Tests only.
//
// Server is one cluster shared by the tests of a test binary, started at
// the first use; New is a private one, for tests that stop and restart it
// (outages must not hit the other tests). A package that uses Server
// calls Main from its TestMain, which stops the shared cluster when the
// tests end; a cluster is also stopped (SIGQUIT) should the test binary
// die, so no postgres outlives it, and the directory such a binary leaves
// is removed by the next binary that starts one (process.go).
//
// The binaries are found in CTXD_POSTGRES_BIN (a bin directory), else in
// /usr/lib/postgresql/*/bin (the highest version; Debian's layout), else
// on PATH. PostgreSQL refuses to run as root, so a root test runs it as
// uid and gid 65534 (nobody), as package otheruid runs its helpers;
// anyone else runs it as themselves. Without the binaries tests skip,
// unless CTXD_REQUIRE_POSTGRES is set (as `make test` sets it), in which
// case they fail: the store's tests must never pass by not running.
package pgtest

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// Binaries are the PostgreSQL programs the harness runs.
type Binaries struct {
	Initdb   string
	Postgres string
}

// FindBinaries looks for initdb and postgres: in $CTXD_POSTGRES_BIN when it
// is set, else in the highest version's /usr/lib/postgresql/*/bin, else on
// PATH. scripts/ensure-postgres.sh looks the same way.
func FindBinaries() (Binaries, error) {
	if dir := os.Getenv("CTXD_POSTGRES_BIN"); dir != "" {
		b := Binaries{Initdb: filepath.Join(dir, "initdb"), Postgres: filepath.Join(dir, "postgres")}
		if !executable(b.Initdb) || !executable(b.Postgres) {
			return Binaries{}, fmt.Errorf("CTXD_POSTGRES_BIN=%s holds no initdb and postgres", dir)
		}
		return b, nil
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	for _, dir := range highestFirst(dirs) {
		b := Binaries{Initdb: filepath.Join(dir, "initdb"), Postgres: filepath.Join(dir, "postgres")}
		if executable(b.Initdb) && executable(b.Postgres) {
			return b, nil
		}
	}
	initdb, err1 := exec.LookPath("initdb")
	postgres, err2 := exec.LookPath("postgres")
	if err := errors.Join(err1, err2); err != nil {
		return Binaries{}, fmt.Errorf("no PostgreSQL found (CTXD_POSTGRES_BIN unset, none in /usr/lib/postgresql/*/bin, none on PATH: %v); scripts/ensure-postgres.sh installs it", err)
	}
	return Binaries{Initdb: initdb, Postgres: postgres}, nil
}

// highestFirst sorts /usr/lib/postgresql/N/bin directories by N, the
// highest first.
func highestFirst(dirs []string) []string {
	slices.SortFunc(dirs, func(a, b string) int { return versionOf(b) - versionOf(a) })
	return dirs
}

// versionOf is the major version in a /usr/lib/postgresql/N/bin path (0
// when there is none).
func versionOf(dir string) int {
	n, _ := strconv.Atoi(filepath.Base(filepath.Dir(dir)))
	return n
}

func executable(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0
}

// required reports whether the tests must fail, not skip, without
// PostgreSQL.
func required() bool { return os.Getenv("CTXD_REQUIRE_POSTGRES") != "" }

// unavailable skips tb, saying why, or fails it when PostgreSQL is
// required.
func unavailable(tb testing.TB, err error) {
	tb.Helper()
	if required() {
		tb.Fatalf("PostgreSQL: %v (CTXD_REQUIRE_POSTGRES is set)", err)
	}
	tb.Skipf("PostgreSQL: %v; set CTXD_REQUIRE_POSTGRES=1 to fail instead", err)
}

// NewDatabase is Server(tb).NewDatabase(tb): a fresh database on the
// shared cluster, dropped when tb ends, as a URL.
func NewDatabase(tb testing.TB) string {
	tb.Helper()
	return Server(tb).NewDatabase(tb)
}

// tail is the last n bytes of the file at path, for an error message.
func tail(path string, n int64) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	if int64(len(data)) > n {
		data = data[int64(len(data))-n:]
	}
	return strings.TrimSpace(string(data))
}
