package frontdoor

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"

	"github.com/ctxd/ctxd"
)

// openaiError is OpenAI's error object.
type openaiError struct {
	Error openaiErrorBody `json:"error"`
}

type openaiErrorBody struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    *string `json:"code"`
}

// openaiErrorOf is err as OpenAI's clients expect it, with its status. A
// prompt over the window is OpenAI's 400 context_length_exceeded, which
// clients recognise and handle by shortening their history.
func openaiErrorOf(err error) (int, openaiError) {
	k := ctxd.KindOf(err)
	status, typ, code := k.Status(), "invalid_request_error", string(k)
	switch k {
	case ctxd.KindDoesNotFit:
		status, code = http.StatusBadRequest, "context_length_exceeded"
	case ctxd.KindNotFound:
		code = "model_not_found"
	case ctxd.KindUnauthorized:
		typ, code = "authentication_error", "invalid_api_key"
	case ctxd.KindForbidden:
		typ = "permission_error"
	case ctxd.KindInternal, ctxd.KindNotRecorded, ctxd.KindBackend, ctxd.KindUnavailable, ctxd.KindInterrupted:
		typ = "server_error"
	}
	return status, openaiError{Error: openaiErrorBody{Message: err.Error(), Type: typ, Code: &code}}
}

// WriteOpenAIError answers with err in OpenAI's error shape.
func WriteOpenAIError(w http.ResponseWriter, err error) {
	status, body := openaiErrorOf(err)
	writeJSON(w, status, body)
}

// WriteOllamaError answers with err in Ollama's shape: {"error": "..."}.
func WriteOllamaError(w http.ResponseWriter, err error) {
	writeJSON(w, ctxd.KindOf(err).Status(), map[string]string{"error": err.Error()})
}

// WriteStreamError ends a door's stream that has already started with
// err, in the shape its clients read mid-stream: an SSE event holding
// OpenAI's error object, or Ollama's {"error"} line. It returns false,
// writing nothing, for a path that is no door's.
func WriteStreamError(w io.Writer, path string, err error) bool {
	switch {
	case IsOpenAIPath(path):
		_, body := openaiErrorOf(err)
		b, _ := json.Marshal(body)
		_, _ = fmt.Fprintf(w, "data: %s\n\n", b)
	case IsOllamaPath(path):
		b, _ := json.Marshal(map[string]string{"error": err.Error()})
		_, _ = w.Write(append(b, '\n'))
	default:
		return false
	}
	return true
}
