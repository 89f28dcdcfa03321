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
		Include: c.Include, Exclude: c.Exclude, NoRedact: !c.Redact}
}
