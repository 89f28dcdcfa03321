package frontdoor

import (
	"encoding/json"
	"net/http"
	"time"

	"github.com/ctxd/ctxd"
)

// streamer writes a door's stream (SSE or NDJSON), committing the 200
// status with the first chunk. A chunk the client does not take within the
// write timeout ends the request as if the client had gone away, so a
// stalled reader never holds a backend slot.
type streamer struct {
	w           http.ResponseWriter
	timeout     time.Duration
	sse         bool
	started     bool
	contentType string
}

func (s *streamer) begin() {
	if s.started {
		return
	}
	s.started = true
	if s.sse {
		s.w.Header().Set("Content-Type", "text/event-stream")
	} else {
		s.w.Header().Set("Content-Type", "application/x-ndjson")
	}
	s.w.Header().Set("Cache-Control", "no-store")
	s.w.WriteHeader(http.StatusOK)
}

// send writes one chunk: v as JSON (an SSE data line, or an NDJSON line).
func (s *streamer) send(v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return ctxd.Errorf(ctxd.KindInternal, "encode chunk: %w", err)
	}
	return s.raw(b)
}

func (s *streamer) raw(b []byte) error {
	s.begin()
	var line []byte
	if s.sse {
		line = append(append([]byte("data: "), b...), '\n', '\n')
	} else {
		line = append(b, '\n')
	}
	rc := http.NewResponseController(s.w)
	_ = rc.SetWriteDeadline(time.Now().Add(s.timeout))
	if _, err := s.w.Write(line); err != nil {
		return ctxd.Errorf(ctxd.KindCanceled, "client went away or stopped reading: %w", err)
	}
	if err := rc.Flush(); err != nil {
		return ctxd.Errorf(ctxd.KindCanceled, "client went away or stopped reading: %w", err)
	}
	_ = rc.SetWriteDeadline(time.Time{})
	return nil
}

// writeJSON answers with one JSON value.
func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
