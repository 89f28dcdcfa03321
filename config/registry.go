package config

import (
	"github.com/ctxd/ctxd/codex"
	"github.com/ctxd/ctxd/sigils"
)

// SigilRegistry builds the sigil registry the configuration describes.
func (c Config) SigilRegistry() (*sigils.Registry, error) {
	defs := make(map[string]sigils.Def, len(c.Sigils))
	for name, s := range c.Sigils {
		defs[name] = sigils.Def{Description: s.Description, Scopes: s.Scopes, TokenSHA256: s.TokenSHA256,
			RevokedSHA256: s.RevokedSHA256, UIDs: s.UIDs, GIDs: s.GIDs, Revoked: s.Revoked}
	}
	return sigils.New(defs, c.Daemon.DefaultSigil)
}

// WalkOptions are the codex section's options for walking a tree.
func (c Codex) WalkOptions() codex.Options {
	return codex.Options{MaxFileBytes: c.MaxFileBytes, MaxTotalBytes: c.MaxTotalBytes,
		Include: c.Include, Exclude: c.Exclude, NoRedact: !c.Redact,
		AllowSecret: c.AllowSecretFiles, AllowHardLinks: c.AllowHardLinks, Within: c.within(), Order: c.Order}
}

// within are the directories a codex may be loaded from (codex.path and
// codex.load_roots), pinned now; none when neither is set (nothing can be
// loaded over the API then, and a codex the daemon is handed directly is
// the operator's).
func (c Codex) within() []codex.AllowedDir {
	roots := c.LoadRoots
	if c.Path != "" {
		roots = append([]string{c.Path}, roots...)
	}
	if len(roots) == 0 {
		return nil
	}
	return codex.Allow(roots)
}
