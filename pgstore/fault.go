package pgstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"strconv"
	"strings"
	"syscall"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/ctxd/ctxd"
)

// fail is err as the store returns it from the request what: nil stays
// nil; an error of a known kind (a trace not found, a conflict) is
// returned as it is; an unreachable server, or a connection it dropped,
// is an error of kind ctxd.KindUnavailable that names the store and says
// the next request tries again; anything else is wrapped, of kind
// ctxd.KindInternal as package sqlite's are.
func (s *Store) fail(ctx context.Context, what string, err error) error {
	var known *ctxd.Error
	switch {
	case err == nil:
		return nil
	case errors.As(err, &known):
		return err
	case unreachable(ctx, err):
		return ctxd.Errorf(ctxd.KindUnavailable,
			"pgstore: %s: the shared store %s is unreachable: %w; ctxd retries at the next request, no restart needed", what, s.name, err)
	}
	return fmt.Errorf("pgstore: %s: %s: %w", what, s.name, err)
}

// unreachable reports whether err says the server could not be reached or
// dropped the connection (it is down, starting, shutting down, or the
// network failed), rather than refusing the request itself. An error of
// ctx's own end is not one.
func unreachable(ctx context.Context, err error) bool {
	if err == nil || ctx.Err() != nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	if code := pgCode(err); code != "" {
		switch {
		case strings.HasPrefix(code, "08"): // connection_exception
			return true
		case code == "57P01", code == "57P02", code == "57P03": // admin_shutdown, crash_shutdown, cannot_connect_now
			return true
		}
		return false // the server answered: the request failed, not the connection
	}
	var connect *pgconn.ConnectError
	var netErr net.Error
	switch {
	case errors.As(err, &connect), errors.As(err, &netErr), pgconn.SafeToRetry(err):
		return true
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, pgconn.ErrConnClosed):
		return true
	case errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE):
		return true
	}
	return false
}

// deadConn reports whether err is a pooled connection found dead (the
// server restarted, or the network dropped it) rather than a new one that
// failed: another connection may do, where a new one failing means the
// server is unreachable and trying again would only wait longer.
func deadConn(ctx context.Context, err error) bool {
	var connect *pgconn.ConnectError
	return unreachable(ctx, err) && !errors.As(err, &connect)
}

// displayName is the database cc connects to as a URL without its
// password (" (password hidden)" follows when there is one): the name
// errors give the store.
func displayName(cc *pgconn.Config) string {
	u := url.URL{Scheme: "postgres", Path: "/" + cc.Database}
	if cc.User != "" {
		u.User = url.User(cc.User)
	}
	port := strconv.Itoa(int(cc.Port))
	if strings.HasPrefix(cc.Host, "/") { // a Unix socket's directory
		u.RawQuery = "host=" + (&url.URL{Path: cc.Host}).EscapedPath() + "&port=" + port
	} else {
		u.Host = net.JoinHostPort(cc.Host, port)
	}
	name := u.String()
	if cc.Password != "" {
		name += " (password hidden)"
	}
	return name
}
