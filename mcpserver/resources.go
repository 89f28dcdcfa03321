package mcpserver

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/client"
)

// uriPrefix starts every codex file's URI; the file's slash path follows,
// each segment escaped.
const uriPrefix = "ctxd-codex:///"

// codexTemplate matches every codex file's URI, so any file of the codex
// loaded now can be read, whatever the list said when it was fetched.
var codexTemplate = &mcp.ResourceTemplate{
	Name:        "codex-file",
	Title:       "A file of the codex",
	Description: "A file of the codebase ctxd serves, as the model's prompts see it (secrets redacted). path is relative to the codex root.",
	MIMEType:    "text/plain",
	URITemplate: uriPrefix + "{+path}",
}

// codexURI is the URI of the codex file at the slash path p.
func codexURI(p string) string {
	parts := strings.Split(p, "/")
	for i, s := range parts {
		parts[i] = url.PathEscape(s)
	}
	return uriPrefix + strings.Join(parts, "/")
}

// codexPath is the slash path a codex URI names, or false.
func codexPath(uri string) (string, bool) {
	if !strings.HasPrefix(uri, uriPrefix) {
		return "", false
	}
	p, err := url.PathUnescape(strings.TrimPrefix(uri, uriPrefix))
	if err != nil || !fs.ValidPath(p) || p == "." {
		return "", false
	}
	return p, true
}

// listCodexMiddleware answers resources/list with the codex's files as
// the daemon lists them now (the SDK's own list is of resources added to
// the server, fixed when added). No codex loaded is an empty list.
func (s *Server) listCodexMiddleware(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		if method != "resources/list" {
			return next(ctx, method, req)
		}
		files, err := s.daemon.CodexFiles(ctx)
		if err != nil && kindOf(err) == ctxd.KindNotFound {
			err, files = nil, nil
		}
		if err != nil {
			s.log.Warn("listing the codex failed", "err", err)
			return nil, fmt.Errorf("listing the codex: %s", describe(err))
		}
		res := &mcp.ListResourcesResult{Resources: make([]*mcp.Resource, len(files))}
		// Never cached: the codex reloads when its files change.
		res.CacheScope = "private"
		for i, f := range files {
			desc := fmt.Sprintf("%d lines", f.Lines)
			if f.Redactions > 0 {
				desc += fmt.Sprintf("; %d secrets redacted", f.Redactions)
			}
			res.Resources[i] = &mcp.Resource{
				URI: codexURI(f.Path), Name: f.Path, MIMEType: "text/plain", Size: f.Bytes, Description: desc,
			}
		}
		return res, nil
	}
}

// readCodexFile reads one codex file from the daemon. A path the codex
// does not hold is "resource not found".
func (s *Server) readCodexFile(ctx context.Context, req *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
	uri := req.Params.URI
	p, ok := codexPath(uri)
	if !ok {
		return nil, mcp.ResourceNotFoundError(uri)
	}
	f, err := s.daemon.CodexFile(ctx, p)
	if err != nil && kindOf(err) == ctxd.KindNotFound {
		return nil, mcp.ResourceNotFoundError(uri)
	}
	if err != nil {
		s.log.Warn("reading a codex file failed", "path", p, "err", err)
		return nil, fmt.Errorf("reading %s: %s", uri, describe(err))
	}
	res := &mcp.ReadResourceResult{Contents: []*mcp.ResourceContents{{URI: uri, MIMEType: "text/plain", Text: f.Content}}}
	res.CacheScope = "private" // and stale at once (TTL 0): the file may change
	return res, nil
}

// kindOf is an error's kind, whether the daemon's client or the request
// path in process returned it.
func kindOf(err error) ctxd.Kind {
	var ae *client.APIError
	if errors.As(err, &ae) {
		return ae.Kind
	}
	return ctxd.KindOf(err)
}
