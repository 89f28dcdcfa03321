package orchestrator

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ctxd/ctxd"
)

// DefaultStoreTimeout bounds each store call a request makes when
// Config.StoreTimeout is not set.
const DefaultStoreTimeout = 10 * time.Second

// errStoreTimeout is the cause of a store call that ran past StoreTimeout.
var errStoreTimeout = errors.New("the store call ran past its deadline")

// storeDeadline bounds each call a request makes to the session and karma
// stores (Config.StoreTimeout), and words the error of one that failed. It
// holds no state besides the timeout: the session and karma sides each
// carry a copy.
type storeDeadline struct {
	timeout time.Duration
}

// ctx is the context of one store call of a request: bounded by the
// timeout, and, if detached, not cancelled with the request (a write that
// must happen once the backend holds an answer).
func (d storeDeadline) ctx(ctx context.Context, detached bool) (context.Context, context.CancelFunc) {
	if detached {
		ctx = context.WithoutCancel(ctx)
	}
	return context.WithTimeoutCause(ctx, d.timeout, errStoreTimeout)
}

// timedOut reports whether the store call of sctx (a storeDeadline's ctx)
// ran past its deadline.
func timedOut(sctx context.Context) bool {
	return errors.Is(context.Cause(sctx), errStoreTimeout)
}

// err is the error of a failed store call of session id: what says what
// the call was to do ("claim the session"). A call that ran past the
// timeout is KindUnavailable (the store is stuck or overloaded: try again
// later), naming the deadline; any other failure is KindInternal.
func (d storeDeadline) err(sctx context.Context, id, what string, err error) error {
	if timedOut(sctx) {
		return &ctxd.Error{Kind: ctxd.KindUnavailable, Err: fmt.Errorf("%w: %w", context.DeadlineExceeded, err),
			Message: fmt.Sprintf("session %q: the session store did not %s within %s (the store timeout); try again later", id, what, d.timeout)}
	}
	return ctxd.Errorf(ctxd.KindInternal, "orchestrator: session %q: %s: %w", id, what, err)
}

// notRecorded is the error of an answer that streamed but whose record
// failed: what says what the record was to do.
func (d storeDeadline) notRecorded(sctx context.Context, id, what string, err error) error {
	cause := err
	msg := fmt.Sprintf("the answer streamed but was not recorded in session %q: %v", id, err)
	if timedOut(sctx) {
		cause = fmt.Errorf("%w: %w", context.DeadlineExceeded, err)
		msg = fmt.Sprintf("the answer streamed but was not recorded in session %q: the session store did not %s within %s (the store timeout)", id, what, d.timeout)
	}
	return &ctxd.Error{Kind: ctxd.KindNotRecorded, Err: cause, Message: msg}
}
