package daemon

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"

	"github.com/ctxd/ctxd/codex"
	"github.com/ctxd/ctxd/runcontext"
	"github.com/ctxd/ctxd/sigils"
)

// CodexEvent is one line of a codex load stream.
type CodexEvent struct {
	Type     string          `json:"type"` // "progress", "codex" or "error"
	Progress *codex.Progress `json:"progress,omitempty"`
	Codex    *CodexStats     `json:"codex,omitempty"`
	Error    string          `json:"error,omitempty"`
}

func (d *Daemon) handleCodexStats(w http.ResponseWriter, r *http.Request) {
	d.mu.RLock()
	set := d.codex
	d.mu.RUnlock()
	if set == nil {
		writeError(w, http.StatusNotFound, "no codex is loaded (set codex.path, or POST /v1/codex/load)")
		return
	}
	writeJSON(w, http.StatusOK, set.stats)
}

// handleCodexLoad loads a codex from a path on this machine and makes it
// the daemon's codex, streaming progress as NDJSON.
func (d *Daemon) handleCodexLoad(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Path string `json:"path"`
	}
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, d.cfg.Daemon.MaxBodyBytes))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil && !errors.Is(err, io.EOF) {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("malformed JSON body: %v", err))
		return
	}
	if strings.TrimSpace(req.Path) == "" {
		writeError(w, http.StatusBadRequest, "path: required (an absolute path on the daemon's machine)")
		return
	}
	if !strings.HasPrefix(req.Path, "/") {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("path %q must be absolute: the daemon does not share your working directory", req.Path))
		return
	}
	if d.orchestrator() == nil {
		writeError(w, http.StatusServiceUnavailable, "backend is starting; a codex is counted with its tokenizer")
		return
	}
	s := &stream{w: w}
	last := -1
	set, err := d.loadCodex(r.Context(), req.Path, func(p codex.Progress) {
		// About a hundred progress lines at most.
		if pct := p.Files * 100 / max(1, p.TotalFiles); pct != last || p.Files == p.TotalFiles {
			last = pct
			_ = s.sendAny(CodexEvent{Type: "progress", Progress: &p})
		}
	})
	if err != nil {
		if !s.started {
			writeError(w, http.StatusBadRequest, err.Error())
			return
		}
		_ = s.sendAny(CodexEvent{Type: "error", Error: err.Error()})
		return
	}
	d.applyCodex(set)
	if d.cfg.Codex.Watch {
		d.watch(d.runCtx, req.Path) // the watcher follows the new codex
	}
	_ = s.sendAny(CodexEvent{Type: "codex", Codex: &set.stats})
}

// handleCodexSearch is the search_codex tool: full-text search of the
// codex for sigils with the search_codex scope.
func (d *Daemon) handleCodexSearch(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	sigil, err := d.sigils.Resolve(q.Get("sigil"))
	if err != nil {
		writeError(w, http.StatusForbidden, err.Error())
		return
	}
	if !sigils.Allows(sigil, sigils.ScopeSearchCodex) {
		writeError(w, http.StatusForbidden, fmt.Sprintf("sigil %q lacks the %q scope", sigil.Name, sigils.ScopeSearchCodex))
		return
	}
	query := strings.TrimSpace(q.Get("q"))
	if query == "" {
		writeError(w, http.StatusBadRequest, "q: required")
		return
	}
	k := 5
	if ks := q.Get("k"); ks != "" {
		if k, err = strconv.Atoi(ks); err != nil || k < 1 || k > 50 {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("k %q must be a number from 1 to 50", ks))
			return
		}
	}
	d.mu.RLock()
	set := d.codex
	d.mu.RUnlock()
	if set == nil || set.state.Retriever == nil {
		writeError(w, http.StatusConflict, "the codex is not indexed for search: it is loaded whole (CAG mode) or not at all")
		return
	}
	ex, err := set.state.Retriever.Search(r.Context(), query, k)
	if err != nil {
		writeError(w, http.StatusInternalServerError, err.Error())
		return
	}
	if ex == nil {
		ex = []runcontext.Excerpt{}
	}
	writeJSON(w, http.StatusOK, map[string]any{"query": query, "excerpts": ex})
}
