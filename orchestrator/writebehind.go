package orchestrator

import (
	"sync"

	"github.com/ctxd/ctxd"
)

// writeBehind is a request's store writes that need not delay its first
// token: a new session's claim and a new karma epoch's snapshot change
// nothing in the prompt, so they are made behind it, once the answer is
// generated (open): on a CPU, a write made while the backend evaluates the
// prompt, or while the first token goes to the client, takes its time from
// them. They are made in order, in one goroutine at a time. The request waits for them before it records its
// answer (a write that failed leaves the answer not recorded) and before
// it releases its session, so the session's next request finds them made.
// Use newWriteBehind.
type writeBehind struct {
	gate chan struct{} // closed by open: the writes may begin
	once sync.Once     // closes gate

	mu   sync.Mutex    // guards done and err
	done chan struct{} // closed when the last write queued has ended; nil: none queued
	err  error         // the first write's failure; the writes after it are not made
}

func newWriteBehind() *writeBehind { return &writeBehind{gate: make(chan struct{})} }

// open lets the writes begin: the answer is generated, or the request
// ends without one.
func (w *writeBehind) open() { w.once.Do(func() { close(w.gate) }) }

// queue makes write once the writes may begin, after the writes queued
// before it, in a goroutine of its own that wait waits for.
func (w *writeBehind) queue(write func() error) {
	w.mu.Lock()
	prev, next := w.done, make(chan struct{})
	w.done = next
	w.mu.Unlock()
	go func() {
		defer close(next)
		<-w.gate
		if prev != nil {
			<-prev
		}
		w.mu.Lock()
		failed := w.err != nil
		w.mu.Unlock()
		if failed {
			return
		}
		if err := write(); err != nil {
			w.mu.Lock()
			w.err = err
			w.mu.Unlock()
		}
	}()
}

// wait lets the writes begin if they have not, waits for every write
// queued so far, and returns the first failure.
func (w *writeBehind) wait() error {
	w.open()
	w.mu.Lock()
	done := w.done
	w.mu.Unlock()
	if done != nil {
		<-done
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.err
}

// notRecorded is the failure of a write behind as the request's error:
// the answer it was made for streamed but is not recorded.
func (w *writeBehind) notRecorded(err error) error {
	if k := ctxd.KindOf(err); k == ctxd.KindNotRecorded || k == ctxd.KindForbidden {
		return err
	}
	return &ctxd.Error{Kind: ctxd.KindNotRecorded, Err: err, Message: "the answer streamed but was not recorded: " + err.Error()}
}
