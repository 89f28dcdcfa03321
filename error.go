package ctxd

import (
	"context"
	"errors"
	"fmt"
	"net/http"
)

// Kind classifies an error for whoever answers the client: each kind maps
// to one HTTP status, and the message says the rest.
type Kind string

// Error kinds.
const (
	KindInvalid      Kind = "invalid"       // the request is malformed or names something impossible
	KindUnauthorized Kind = "unauthorized"  // no token, or one no sigil holds
	KindForbidden    Kind = "forbidden"     // the sigil may not do this
	KindNotFound     Kind = "not_found"     // no such thing
	KindConflict     Kind = "conflict"      // not possible in the daemon's current state
	KindTooLarge     Kind = "too_large"     // the body is over the cap
	KindTooMany      Kind = "too_many"      // a bound on what one sigil (or all) may hold is reached
	KindUnsupported  Kind = "unsupported"   // a content type ctxd does not read
	KindDoesNotFit   Kind = "does_not_fit"  // the prompt does not fit even after the governor's actions
	KindCanceled     Kind = "canceled"      // the client went away or cancelled
	KindBackend      Kind = "backend"       // the backend failed or lacks the model
	KindUnavailable  Kind = "unavailable"   // starting, backend unreachable, or shutting down
	KindInternal     Kind = "internal"      // a bug or a local failure (disk, database)
	KindNotRecorded  Kind = "not_recorded"  // the answer streamed but could not be recorded
	KindInterrupted  Kind = "interrupted"   // the daemon stopped the answer (shutting down); it was not recorded
	KindMethod       Kind = "method"        // the route exists, the method does not
	KindUnknownRoute Kind = "unknown_route" // no such route
)

// Status is the HTTP status of the kind.
func (k Kind) Status() int {
	switch k {
	case KindInvalid:
		return http.StatusBadRequest
	case KindUnauthorized:
		return http.StatusUnauthorized
	case KindForbidden:
		return http.StatusForbidden
	case KindNotFound, KindUnknownRoute:
		return http.StatusNotFound
	case KindMethod:
		return http.StatusMethodNotAllowed
	case KindConflict:
		return http.StatusConflict
	case KindTooLarge:
		return http.StatusRequestEntityTooLarge
	case KindTooMany:
		return http.StatusTooManyRequests
	case KindUnsupported:
		return http.StatusUnsupportedMediaType
	case KindDoesNotFit:
		return http.StatusUnprocessableEntity
	case KindCanceled:
		return 499 // client closed the request (nginx's convention); nobody reads it
	case KindBackend:
		return http.StatusBadGateway
	case KindUnavailable, KindInterrupted:
		return http.StatusServiceUnavailable
	}
	return http.StatusInternalServerError
}

// Error is an error of a known kind. Message is the whole message for the
// client and names the problem; Err, if set, is the cause, kept for
// errors.Is and errors.As.
type Error struct {
	Kind    Kind
	Message string
	Err     error
}

func (e *Error) Error() string {
	if e.Message == "" && e.Err != nil {
		return e.Err.Error()
	}
	return e.Message
}

func (e *Error) Unwrap() error { return e.Err }

// Errorf returns an *Error of kind k whose message is the formatted text.
// A %w verb in format sets Err.
func Errorf(k Kind, format string, args ...any) *Error {
	err := fmt.Errorf(format, args...)
	return &Error{Kind: k, Message: err.Error(), Err: errors.Unwrap(err)}
}

// Kinded is implemented by errors of other packages that know their kind
// (the governor's limit errors, say) without wrapping an *Error.
type Kinded interface {
	ErrorKind() Kind
}

// KindOf is the kind of err: that of the first *Error in its chain, else
// of the first Kinded, else KindCanceled for a cancelled context, else
// KindInternal.
func KindOf(err error) Kind {
	var e *Error
	var k Kinded
	switch {
	case err == nil:
		return ""
	case errors.As(err, &e):
		return e.Kind
	case errors.As(err, &k):
		return k.ErrorKind()
	case errors.Is(err, context.Canceled):
		return KindCanceled
	}
	return KindInternal
}
