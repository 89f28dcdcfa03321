package httpapi

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestRecovererAnswersInTheDoorsShape: a handler's panic is answered with
// an error its client can read, in the shape of the route's door, before
// and after its stream started, and the daemon goes on.
func TestRecovererAnswersInTheDoorsShape(t *testing.T) {
	d := &Server{log: slog.New(slog.DiscardHandler)}
	cases := []struct {
		path, before, after string
	}{
		{"/v1/ask", "{\n  \"error\": \"internal error", `{"type":"error"`},
		{"/v1/chat/completions", `{"error":{"message":"internal error`, `data: {"error":{"message":"internal error`},
		{"/api/chat", `{"error":"internal error`, `{"error":"internal error`},
	}
	for _, c := range cases {
		for _, streamed := range []bool{false, true} {
			h := d.recoverer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if streamed {
					io.WriteString(w, "first piece\n")
				}
				panic("boom")
			}))
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, c.path, nil))
			body := rec.Body.String()
			want, status := c.before, http.StatusInternalServerError
			if streamed {
				want, status = c.after, http.StatusOK
				body = strings.TrimPrefix(body, "first piece\n")
			}
			if rec.Code != status || !strings.HasPrefix(body, want) {
				t.Errorf("%s (streamed %v): %d %q; want %d and %q first", c.path, streamed, rec.Code, body, status, want)
			}
		}
	}
}
