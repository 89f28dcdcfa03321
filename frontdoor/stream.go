package frontdoor

import (
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/ctxd/ctxd"
)

// streamer writes a door's stream (SSE or NDJSON). The 200 status is
// committed as soon as the request is accepted (the governor made its
// prompt fit) or HeaderGrace after it arrived, whichever comes first, so
// no client's header timeout fires while the request waits for a slot or
// the backend reads a long prompt; until the answer's first piece a
// keep-alive line (an SSE comment, or an empty NDJSON chunk) is written
// every KeepAlive, so no idle timeout fires either. A refusal made before
// the commit keeps its HTTP status; one made after it is the stream's last
// chunk, in the door's error shape.
//
// A chunk the client does not take within the write timeout ends the
// request as if the client had gone away, so a stalled reader never holds
// a backend slot.
type streamer struct {
	w       http.ResponseWriter
	timeout time.Duration
	sse     bool

	mu      sync.Mutex // guards the writes and the fields below: the keeper writes too
	started bool       // the status is committed
	last    time.Time  // the last write

	stop, done chan struct{} // the keeper's; nil when there is none
}

// keep commits the stream once accepted is closed or grace has passed,
// then writes beat() whenever nothing was written for every, until
// release. beat is one line's bytes, newline excluded.
func (s *streamer) keep(accepted <-chan struct{}, grace, every time.Duration, beat func() []byte) {
	s.stop, s.done = make(chan struct{}), make(chan struct{})
	go func() {
		defer close(s.done)
		t := time.NewTimer(grace)
		defer t.Stop()
		select {
		case <-accepted:
		case <-t.C:
		case <-s.stop:
			return
		}
		s.mu.Lock()
		err := s.commitLocked()
		s.mu.Unlock()
		if err != nil {
			return
		}
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			select {
			case <-tick.C:
				s.mu.Lock()
				if time.Since(s.last) >= every*3/4 {
					err = s.writeLocked(beat())
				}
				s.mu.Unlock()
				if err != nil {
					return
				}
			case <-s.stop:
				return
			}
		}
	}()
}

// release stops the keeper and waits for it; the stream is the caller's
// alone afterwards. It reports whether the status was committed.
func (s *streamer) release() bool {
	if s.stop != nil {
		close(s.stop)
		<-s.done
		s.stop = nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.started
}

// commitLocked writes the status and the headers, once.
func (s *streamer) commitLocked() error {
	if s.started {
		return nil
	}
	s.started = true
	if s.sse {
		s.w.Header().Set("Content-Type", "text/event-stream")
	} else {
		s.w.Header().Set("Content-Type", "application/x-ndjson")
	}
	s.w.Header().Set("Cache-Control", "no-store")
	s.w.Header().Set("X-Accel-Buffering", "no")
	s.w.WriteHeader(http.StatusOK)
	return s.flushLocked()
}

// send writes one chunk: v as JSON (an SSE data line, or an NDJSON line).
func (s *streamer) send(v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return ctxd.Errorf(ctxd.KindInternal, "encode chunk: %w", err)
	}
	return s.raw(b)
}

// raw writes one data line: b as an SSE event, or as an NDJSON line.
func (s *streamer) raw(b []byte) error {
	if s.sse {
		b = append(append([]byte("data: "), b...), '\n')
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.commitLocked(); err != nil {
		return err
	}
	return s.writeLocked(b)
}

// writeLocked writes line and a newline (SSE: the blank line that ends an
// event) and flushes it.
func (s *streamer) writeLocked(line []byte) error {
	line = append(line, '\n')
	if s.sse {
		line = append(line, '\n')
	}
	rc := http.NewResponseController(s.w)
	_ = rc.SetWriteDeadline(time.Now().Add(s.timeout))
	if _, err := s.w.Write(line); err != nil {
		return ctxd.Errorf(ctxd.KindCanceled, "client went away or stopped reading: %w", err)
	}
	return s.flushLocked()
}

func (s *streamer) flushLocked() error {
	rc := http.NewResponseController(s.w)
	_ = rc.SetWriteDeadline(time.Now().Add(s.timeout))
	if err := rc.Flush(); err != nil {
		return ctxd.Errorf(ctxd.KindCanceled, "client went away or stopped reading: %w", err)
	}
	_ = rc.SetWriteDeadline(time.Time{})
	s.last = time.Now()
	return nil
}

// startStream has s commit when ask is accepted (or after the header
// grace) and keep alive with beat meanwhile; the caller releases s once
// the ask returns. It returns the sniffer the answer goes through when
// tools are offered (toolOpen: the served model's own opener of a call,
// Model.ToolOpen), else nil.
func (d *Doors) startStream(s *streamer, ask *ctxd.AskRequest, toolOpen string, beat func() []byte) *toolSniffer {
	accepted := make(chan struct{})
	ask.Accepted = sync.OnceFunc(func() { close(accepted) })
	s.keep(accepted, d.cfg.HeaderGrace, d.cfg.KeepAlive, beat)
	if len(ask.Tools) > 0 {
		return &toolSniffer{open: toolOpen}
	}
	return nil
}

// sseBeat is the SSE door's keep-alive: a comment line, which clients'
// event parsers skip.
func sseBeat() []byte { return []byte(": ctxd: the prompt is being read") }

// writeJSON answers with one JSON value.
func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// toolSniffer decides, as an answer streams, whether it is text or tool
// calls, by how it begins: an answer that starts (past white space) with
// '{' or '[', a ```json fence, a <tool_call> tag, or the text that opens
// a call in the model's own syntax (Model.ToolOpen) may be tool calls
// (toolcall reads only those) and is held whole until it ends; any other
// is text and streams as it comes. So content streams even when tools are
// offered, and a tool call is never sent as text.
type toolSniffer struct {
	held    strings.Builder
	decided bool
	text    bool
	open    string // the model's own opener, if any
}

// toolOpeners are how an answer that may be tool calls begins.
var toolOpeners = []string{"{", "[", "```json", "<tool_call>"}

// feed takes the answer's next piece and returns what may be sent as text
// now ("" while it holds).
func (t *toolSniffer) feed(piece string) string {
	if t.decided && t.text {
		return piece
	}
	t.held.WriteString(piece)
	if t.decided {
		return ""
	}
	s := strings.TrimLeft(t.held.String(), " \t\r\n")
	if s == "" {
		return ""
	}
	for _, o := range append(toolOpeners, t.open) {
		if o == "" {
			continue
		}
		if strings.HasPrefix(s, o) {
			t.decided = true // a candidate: held to its end
			return ""
		}
		if strings.HasPrefix(o, s) {
			return "" // not yet told apart
		}
	}
	t.decided, t.text = true, true
	out := t.held.String()
	t.held.Reset()
	return out
}

// rest is what the sniffer still holds: at the answer's end, text to
// send if it was not tool calls.
func (t *toolSniffer) rest() string { return t.held.String() }
