package pgstore

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ctxd/ctxd"
)

// Store is the session store and the karma store on one PostgreSQL
// database, through a pool of connections. It is safe for concurrent
// use, and several Stores (in one process or in several daemons) may
// share the database.
type Store struct {
	pool     *pgxpool.Pool
	name     string // the database as errors name it: its URL, no password
	attempts int    // how often a transaction is begun before an unreachable server fails the request
}

var (
	_ ctxd.Store          = (*Store)(nil)
	_ ctxd.SessionCounter = (*Store)(nil)
	_ ctxd.KarmaStore     = (*Store)(nil)
)

// OpenOptions tune the connection pool.
type OpenOptions struct {
	// MaxConns caps the connections the pool holds to the server. Zero
	// leaves the URL's pool_max_conns parameter in force, or else pgxpool's
	// default (the larger of 4 and the number of CPUs); a positive value
	// overrides both.
	MaxConns int
}

// defaultConnectTimeout bounds a connection attempt when the URL sets no
// connect_timeout, so that a server that does not answer fails a request
// rather than holding it.
const defaultConnectTimeout = 10 * time.Second

// Open connects to the PostgreSQL database at url (a postgres:// URL or a
// key=value connection string, as libpq reads them; pgxpool's pool_*
// parameters are honoured) and migrates it, with the default OpenOptions.
func Open(ctx context.Context, url string) (*Store, error) {
	return OpenWith(ctx, url, OpenOptions{})
}

// OpenWith is Open with the pool tuned by o.
func OpenWith(ctx context.Context, url string, o OpenOptions) (*Store, error) {
	if o.MaxConns < 0 {
		return nil, fmt.Errorf("pgstore: MaxConns %d is negative", o.MaxConns)
	}
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, parseError(err)
	}
	if o.MaxConns > 0 {
		cfg.MaxConns = int32(o.MaxConns)
	}
	if cfg.ConnConfig.ConnectTimeout == 0 {
		cfg.ConnConfig.ConnectTimeout = defaultConnectTimeout
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("pgstore: %s: %w", displayName(&cfg.ConnConfig.Config), err)
	}
	s := &Store{pool: pool, name: displayName(&cfg.ConnConfig.Config), attempts: int(cfg.MaxConns) + 1}
	if err := s.migrate(ctx); err != nil {
		pool.Close()
		if unreachable(ctx, err) {
			return nil, ctxd.Errorf(ctxd.KindUnavailable, "pgstore: the shared store %s is unreachable: %w", s.name, err)
		}
		return nil, s.fail(ctx, "open", err)
	}
	return s, nil
}

// parseError is a URL's parse error without the URL, which may hold a
// password: pgx masks the ones it recognizes, not all.
func parseError(err error) error {
	var ue *url.Error
	switch inner := errors.Unwrap(err); {
	case errors.As(err, &ue), inner == nil:
		return errors.New("pgstore: the shared store's URL does not parse (it is not shown: it may hold a password)")
	default:
		return fmt.Errorf("pgstore: the shared store's URL does not parse (it is not shown: it may hold a password): %w", inner)
	}
}

// Close closes the pool's connections, waiting for those in use.
func (s *Store) Close() error {
	s.pool.Close()
	return nil
}

// Name is the database as the store's errors name it: its URL without
// the password.
func (s *Store) Name() string { return s.name }

// begin begins a transaction, on another connection (or a new one) while
// a pooled connection turns out to be dead: a server that restarted
// leaves the pool's connections broken, and none of them has done
// anything of the request yet. A new connection that fails ends the
// request: the server is unreachable.
func (s *Store) begin(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error) {
	for i := 1; ; i++ {
		tx, err := s.pool.BeginTx(ctx, opts)
		if err == nil || i >= s.attempts || !deadConn(ctx, err) {
			return tx, err
		}
	}
}

// write runs fn in a read-committed transaction and commits it; what
// names the request in errors.
func (s *Store) write(ctx context.Context, what string, fn func(pgx.Tx) error) error {
	tx, err := s.begin(ctx, pgx.TxOptions{})
	if err != nil {
		return s.fail(ctx, what, err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	if err := fn(tx); err != nil {
		return s.fail(ctx, what, err)
	}
	return s.fail(ctx, what, tx.Commit(ctx))
}

// readOnly is a transaction whose reads all see one committed state.
var readOnly = pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}

// read runs fn in a read-only transaction that sees one committed state;
// fn runs again, on another connection, when the first was dead (a read
// can be repeated), so it must set its results only from what it reads.
func (s *Store) read(ctx context.Context, what string, fn func(pgx.Tx) error) error {
	for i := 1; ; i++ {
		err := s.readOnce(ctx, fn)
		if err == nil || i >= s.attempts || !deadConn(ctx, err) {
			return s.fail(ctx, what, err)
		}
	}
}

func (s *Store) readOnce(ctx context.Context, fn func(pgx.Tx) error) error {
	tx, err := s.begin(ctx, readOnly)
	if err != nil {
		return err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	if err := fn(tx); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

// isNoRows reports whether err is QueryRow's "no rows".
func isNoRows(err error) bool { return errors.Is(err, pgx.ErrNoRows) }

// pgCode is the SQLSTATE of a server's error in err, "" for none.
func pgCode(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code
	}
	return ""
}
