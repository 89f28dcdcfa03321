// Package secrets finds credentials in text so they can be redacted before
// the text goes into a prompt.
//
// Its rules are gitleaks' maintained default rules, adopted as data:
// gitleaks.toml is gitleaks' config/gitleaks.toml as released (the version
// is in its header; MIT license, Copyright (c) 2019 Zachary Rice, see
// LICENSE.gitleaks), embedded and run here with gitleaks' semantics — a
// keyword prefilter, Go regular expressions, the secret group, an entropy
// threshold, global and per-rule allowlists of patterns and stop words.
// To these ctxd adds rules of its own for what gitleaks lets pass (plain
// passwords assigned in code and .env or YAML files, private keys cut
// short before their END line, passwords in URLs and DSNs, Docker registry
// auth, Authorization headers) and allowlists for well-known example
// credentials and placeholders. Version names the whole set: a cache of
// what was found must be keyed by it.
//
// A rule runs only on the lines around its keywords, found for all rules
// at once in one case-insensitive pass (an Aho-Corasick automaton), which
// is what makes scanning a whole source tree cheap.
//
// It is not gitleaks: it scans a text, not a repository's history, and
// decides by content alone, so that a finding can be cached by the
// content's hash. Rules that gitleaks scopes to some file paths, path
// allowlists and encoded (base64, hex) secrets are out of its scope; which
// files not to read at all is the caller's business (codex.SecretFile).
// The keyword prefilter folds ASCII case only, so a pattern's (?i) match
// through a non-ASCII fold (ſ for s, the Kelvin sign for k) is not seen.
package secrets
