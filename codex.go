package ctxd

import (
	"crypto/sha256"
	"encoding/hex"
	"slices"
	"strings"
)

// CodexStats describes the loaded codex (GET /v1/codex, ctxd codex stats).
type CodexStats struct {
	Name   string `json:"name"`
	Root   string `json:"root"`
	Files  int    `json:"files"`
	Lines  int64  `json:"lines"`
	Bytes  int64  `json:"bytes"`
	Tokens int64  `json:"tokens"` // exact total when TokensExact; otherwise of the files counted so far
	// TokensExact says Tokens is the exact whole-tree total. A codex too
	// large to load whole is not counted to decide that: its totals are
	// counted in the background, at low priority, and Counting says how far.
	TokensExact bool           `json:"tokens_exact"`
	Counting    *CountProgress `json:"counting,omitempty"`
	// Read is how many files the last load opened: a reload of an
	// unchanged tree opens none (the stat index proves them unchanged).
	Read       int              `json:"read"`
	Plan       CodexPlan        `json:"plan"`
	Largest    []FileTokens     `json:"largest"`
	Redactions int              `json:"redactions"`
	Redacted   []FileRedactions `json:"redacted,omitempty"`
	Skipped    []Skipped        `json:"skipped"`
	Reindexed  int              `json:"reindexed"`
	LoadMillis float64          `json:"load_ms"`
	Redacting  bool             `json:"redacting"`
	Order      CodexOrder       `json:"order"`
}

// Codex file orders (codex.order).
const (
	// OrderStability puts the files that change least first: an edit
	// re-evaluates the codex from the edited file on.
	OrderStability = "stability"
	// OrderPath is the files in path order.
	OrderPath = "path"
)

// CodexOrder is the order the codex's files render in, and how the last
// load arrived at it.
type CodexOrder struct {
	Kind string `json:"kind"` // OrderStability or OrderPath
	// Source is where the order came from: the git history read (how many
	// commits from which HEAD), modification times, or path order.
	Source string `json:"source"`
	// Kept says the load kept the order of the load before (the same
	// tree) up to its first changed file, and arranged the files from
	// there again with the change counted (what changed moves late). An
	// order is made anew only at a codex epoch: the first load of a tree
	// (no order saved for it), or a change of codex.order.
	Kept bool `json:"kept"`
	// Changed are the files whose content changed or that were added
	// since the load before, in their new order; Removed those gone.
	Changed []string `json:"changed,omitempty"`
	Removed []string `json:"removed,omitempty"`
	// From is the index of the first file not where the load before had
	// it (the files before it render as they did, so a backend's cache
	// holds them); -1 when the order was made anew.
	From int `json:"from"`
	// Revisited says the tree is a version seen before (a branch switched
	// back, an edit undone): it renders in the order it had then, so a
	// backend's slot saved for it serves again.
	Revisited bool `json:"revisited,omitempty"`
	// EditsLast says the files that changed went to the end and the
	// others kept their order (backend.cache_reuse): a backend that
	// shifts cached chunks evaluates only the files that moved.
	EditsLast bool `json:"edits_last,omitempty"`
}

// CountProgress is how far the background count of a codex's tokens is.
type CountProgress struct {
	Files      int     `json:"files"`
	TotalFiles int     `json:"total_files"`
	Bytes      int64   `json:"bytes"`
	TotalBytes int64   `json:"total_bytes"`
	Percent    float64 `json:"percent"`         // of the bytes
	Error      string  `json:"error,omitempty"` // the count stopped: why
}

// FileTokens is one file's size in tokens.
type FileTokens struct {
	Path   string `json:"path"`
	Tokens int    `json:"tokens"`
}

// FileRedactions lists what was redacted in one file.
type FileRedactions struct {
	Path       string      `json:"path"`
	Redactions []Redaction `json:"redactions"`
}

// Redaction is one credential replaced in a file.
type Redaction struct {
	Rule string `json:"rule"`
	Line int    `json:"line"`
}

// Skipped is a file that was not loaded, and why.
type Skipped struct {
	Path   string `json:"path"`
	Reason string `json:"reason"`
}

// CodexProgress is reported as a codex loads: files read (stage
// "reading"), then, for a tree retrieved from, files indexed ("indexing").
// Tokens are not counted to load (see CodexStats.Counting).
type CodexProgress struct {
	Stage      string `json:"stage"`
	Files      int    `json:"files"`
	TotalFiles int    `json:"total_files"`
	Bytes      int64  `json:"bytes"`
	TotalBytes int64  `json:"total_bytes"`
}

// Codex load stages.
const (
	CodexStageReading  = "reading"
	CodexStageIndexing = "indexing"
)

// Codex load stream event types.
const (
	CodexEventProgress = "progress"
	CodexEventCodex    = "codex"
	CodexEventError    = "error"
)

// CodexEvent is one line of a codex load stream (NDJSON).
type CodexEvent struct {
	Type     string         `json:"type"` // CodexEventProgress, CodexEventCodex or CodexEventError
	Progress *CodexProgress `json:"progress,omitempty"`
	Codex    *CodexStats    `json:"codex,omitempty"`
	Error    string         `json:"error,omitempty"`
	Status   int            `json:"status,omitempty"`
	Kind     Kind           `json:"kind,omitempty"`
}

// CodexFile is one file of the codex, as GET /v1/codex/files lists it.
type CodexFile struct {
	Path       string `json:"path"` // slash-separated, relative to the codex root
	Bytes      int64  `json:"bytes"`
	Lines      int    `json:"lines"`
	SHA256     string `json:"sha256"`
	Redactions int    `json:"redactions,omitempty"` // secrets replaced in its content
}

// CodexFileContent is GET /v1/codex/files/{path}: a file's content as
// prompts see it (secrets redacted).
type CodexFileContent struct {
	CodexFile
	Content string `json:"content"`
}

// CodexVersion identifies a codex's content: its files' paths and hashes,
// in path order whatever order a prompt holds them in ("" for no files).
func CodexVersion(files []CodexFile) string {
	if len(files) == 0 {
		return ""
	}
	sorted := slices.Clone(files)
	slices.SortFunc(sorted, func(a, b CodexFile) int { return strings.Compare(a.Path, b.Path) })
	var sb strings.Builder
	for _, f := range sorted {
		sb.WriteString(f.Path)
		sb.WriteByte(0)
		sb.WriteString(f.SHA256)
		sb.WriteByte('\n')
	}
	h := sha256.Sum256([]byte(sb.String()))
	return hex.EncodeToString(h[:16])
}
