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

// storeCtx is the context of one store call of a request: bounded by
// StoreTimeout, and, if detached, not cancelled with the request (a write
// that must happen once the backend holds an answer).
func (o *Orchestrator) storeCtx(ctx context.Context, detached bool) (context.Context, context.CancelFunc) {
	if detached {
		ctx = context.WithoutCancel(ctx)
	}
	return context.WithTimeoutCause(ctx, o.cfg.StoreTimeout, errStoreTimeout)
}

// timedOut reports whether the store call of sctx (a storeCtx) ran past
// its deadline.
func timedOut(sctx context.Context) bool {
	return errors.Is(context.Cause(sctx), errStoreTimeout)
}

// storeErr is the error of a failed store call of session id: what says
// what the call was to do ("claim the session"). A call that ran past
// StoreTimeout is KindUnavailable (the store is stuck or overloaded: try
// again later), naming the deadline; any other failure is KindInternal.
func (o *Orchestrator) storeErr(sctx context.Context, id, what string, err error) error {
	if timedOut(sctx) {
		return &ctxd.Error{Kind: ctxd.KindUnavailable, Err: fmt.Errorf("%w: %w", context.DeadlineExceeded, err),
			Message: fmt.Sprintf("session %q: the session store did not %s within %s (the store timeout); try again later", id, what, o.cfg.StoreTimeout)}
	}
	return ctxd.Errorf(ctxd.KindInternal, "orchestrator: session %q: %s: %w", id, what, err)
}

// notRecorded is the error of an answer that streamed but whose record
// failed: what says what the record was to do.
func (o *Orchestrator) notRecorded(sctx context.Context, id, what string, err error) error {
	cause := err
	msg := fmt.Sprintf("the answer streamed but was not recorded in session %q: %v", id, err)
	if timedOut(sctx) {
		cause = fmt.Errorf("%w: %w", context.DeadlineExceeded, err)
		msg = fmt.Sprintf("the answer streamed but was not recorded in session %q: the session store did not %s within %s (the store timeout)", id, what, o.cfg.StoreTimeout)
	}
	return &ctxd.Error{Kind: ctxd.KindNotRecorded, Err: cause, Message: msg}
}
