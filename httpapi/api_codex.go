package httpapi

import (
	"context"
	"fmt"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/engine"
	"github.com/ctxd/ctxd/runcontext"
	"github.com/ctxd/ctxd/sigils"
)

// handleCodexStats reports the loaded codex from a snapshot: it never
// waits for a load in progress.
func (srv codexRoutes) handleCodexStats(w http.ResponseWriter, r *http.Request) {
	// The codex's files, sizes and redactions: for a sigil that may read
	// the codex or load one.
	s, err := srv.actor(r, r.URL.Query().Get("sigil"))
	if err == nil && !sigils.Allows(s, sigils.ScopeCodexLoad) {
		err = requireScope(s, sigils.ScopeSearchCodex)
	}
	var e *engine.Engine
	if err == nil {
		e, err = srv.core.Engine()
	}
	if err != nil {
		writeError(w, err)
		return
	}
	st, ok := e.Codex.Stats()
	if !ok {
		writeError(w, ctxd.Errorf(ctxd.KindNotFound, "no codex is loaded (set codex.path, or POST /v1/codex/load)"))
		return
	}
	writeJSON(w, http.StatusOK, st)
}

// handleCodexLoad loads a codex from a path on this machine and makes it
// the daemon's codex, streaming progress as NDJSON. A client that goes
// away cancels the load; the current codex stays.
func (srv codexRoutes) handleCodexLoad(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Path string `json:"path"`
	}
	if err := srv.decodeJSON(w, r, &req, `{"path": "/abs/path"}`); err != nil {
		writeError(w, err)
		return
	}
	if strings.TrimSpace(req.Path) == "" {
		writeError(w, ctxd.Errorf(ctxd.KindInvalid, "path: required (an absolute path on the daemon's machine)"))
		return
	}
	if !strings.HasPrefix(req.Path, "/") {
		writeError(w, ctxd.Errorf(ctxd.KindInvalid, "path %q must be absolute: the daemon does not share your working directory", req.Path))
		return
	}
	who, err := srv.actor(r, r.URL.Query().Get("sigil"))
	if err == nil {
		err = requireScope(who, sigils.ScopeCodexLoad)
	}
	if err == nil {
		err = srv.loadAllowed(req.Path)
	}
	if err != nil {
		writeError(w, err)
		return
	}
	e, err := srv.core.Engine()
	if err != nil {
		writeError(w, fmt.Errorf("a codex is counted with the model's tokenizer: %w", err))
		return
	}
	s := &stream{w: w, timeout: srv.cfg.Daemon.WriteTimeout.Duration}
	last := -1
	st, err := e.Codex.Load(r.Context(), req.Path, func(p ctxd.CodexProgress) {
		// About a hundred progress lines at most.
		if pct := p.Files * 100 / max(1, p.TotalFiles); pct != last || p.Files == p.TotalFiles {
			last = pct
			_ = s.send(ctxd.CodexEvent{Type: ctxd.CodexEventProgress, Progress: &p})
		}
	})
	if err != nil {
		if !s.started {
			writeError(w, err)
			return
		}
		k := ctxd.KindOf(err)
		_ = s.send(ctxd.CodexEvent{Type: ctxd.CodexEventError, Error: err.Error(), Status: k.Status(), Kind: k})
		return
	}
	_ = s.send(ctxd.CodexEvent{Type: ctxd.CodexEventCodex, Codex: &st})
}

// handleCodexSearch is the search_codex tool: full-text search of the
// codex for sigils with the search_codex scope.
func (srv codexRoutes) handleCodexSearch(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	sigil, err := srv.actor(r, q.Get("sigil"))
	if err != nil {
		writeError(w, err)
		return
	}
	k := 0 // the default
	if ks := q.Get("k"); ks != "" {
		if k, err = strconv.Atoi(ks); err != nil || k < 1 {
			k = -1 // refused, naming the parameter
		}
	}
	query := strings.TrimSpace(q.Get("q"))
	ex, err := srv.searchCodex(r.Context(), sigil, query, k)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"query": query, "excerpts": ex})
}

// searchCodex is the search_codex tool for sigil, on every door: the
// query's k best excerpts (k from 1 to 50; 0: 5).
func (srv codexRoutes) searchCodex(ctx context.Context, sigil runcontext.Sigil, query string, k int) ([]ctxd.Excerpt, error) {
	if err := requireScope(sigil, sigils.ScopeSearchCodex); err != nil {
		return nil, err
	}
	if query == "" {
		return nil, ctxd.Errorf(ctxd.KindInvalid, "q: required")
	}
	if k == 0 {
		k = 5
	}
	if k < 1 || k > 50 {
		return nil, ctxd.Errorf(ctxd.KindInvalid, "k: must be a number from 1 to 50")
	}
	e, err := srv.core.Engine()
	if err != nil {
		return nil, err
	}
	ex, err := e.Codex.Search(ctx, query, k)
	if err != nil {
		return nil, err
	}
	if ex == nil {
		ex = []ctxd.Excerpt{}
	}
	return ex, nil
}

// codexReader is the request path for a sigil that may read the codex
// (the search_codex scope), or the error.
func (srv codexRoutes) codexReader(sigil runcontext.Sigil) (*engine.Engine, error) {
	if err := requireScope(sigil, sigils.ScopeSearchCodex); err != nil {
		return nil, err
	}
	return srv.core.Engine()
}

// codexFiles lists the codex's files, for sigils that may read it.
func (srv codexRoutes) codexFiles(sigil runcontext.Sigil) ([]ctxd.CodexFile, error) {
	e, err := srv.codexReader(sigil)
	if err != nil {
		return nil, err
	}
	files, ok := e.Codex.Files()
	if !ok {
		return nil, ctxd.Errorf(ctxd.KindNotFound, "no codex is loaded")
	}
	return files, nil
}

// codexFile is one codex file's content as prompts see it (secrets
// redacted), for sigils that may read the codex.
func (srv codexRoutes) codexFile(sigil runcontext.Sigil, path string) (*ctxd.CodexFileContent, error) {
	e, err := srv.codexReader(sigil)
	if err != nil {
		return nil, err
	}
	f, err := e.Codex.File(path)
	if err != nil {
		return nil, err
	}
	return &f, nil
}

func (srv codexRoutes) handleCodexFiles(w http.ResponseWriter, r *http.Request) {
	sigil, err := srv.actor(r, r.URL.Query().Get("sigil"))
	var files []ctxd.CodexFile
	if err == nil {
		files, err = srv.codexFiles(sigil)
	}
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"files": files})
}

func (srv codexRoutes) handleCodexFile(w http.ResponseWriter, r *http.Request) {
	sigil, err := srv.actor(r, r.URL.Query().Get("sigil"))
	var f *ctxd.CodexFileContent
	if err == nil {
		f, err = srv.codexFile(sigil, r.PathValue("path"))
	}
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, f)
}

// handleSigil says which sigil a request acts as and its scopes: what a
// client (the MCP server) may offer.
func (srv daemonRoutes) handleSigil(w http.ResponseWriter, r *http.Request) {
	sigil, err := srv.actor(r, r.URL.Query().Get("sigil"))
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, ctxd.SigilInfo{Name: sigil.Name, Scopes: sigil.Scopes, Authenticated: byToken(r),
		Description: srv.cfg.Sigils.Description(sigil.Name)})
}

// loadAllowed is nil for a codex path the operator allows: the configured
// codex.path or a directory under one of codex.load_roots, after symlinks
// are resolved (a link inside a root to a directory outside it is not
// under the root).
func (srv codexRoutes) loadAllowed(path string) error {
	real, err := filepath.EvalSymlinks(path)
	if err != nil {
		return ctxd.Errorf(ctxd.KindInvalid, "path %q: %v", path, err)
	}
	roots := srv.cfg.LoadRoots
	for _, root := range roots {
		rr, err := filepath.EvalSymlinks(root)
		if err != nil {
			continue
		}
		if rel, err := filepath.Rel(rr, real); err == nil && rel != ".." && !strings.HasPrefix(rel, "../") {
			return nil
		}
	}
	if len(roots) == 0 {
		return ctxd.Errorf(ctxd.KindForbidden, "path %q: the operator allows no codex to be loaded over the API (set codex.path, or list directories in codex.load_roots)", path)
	}
	return ctxd.Errorf(ctxd.KindForbidden, "path %q is not under a directory the operator allows (codex.path and codex.load_roots: %s)", path, strings.Join(roots, ", "))
}
