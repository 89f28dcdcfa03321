package codex

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"github.com/BurntSushi/toml"

	"github.com/ctxd/ctxd"
)

// SettingsFile is the codex's own configuration, at the codex root. It is
// a hidden file, so it is never part of the codex's content.
const SettingsFile = ".ctxd.toml"

// Settings are what a codex says about itself. Its caps and limits may
// only tighten the daemon's (see governor.Limits.Tighten and Options.Merge).
type Settings struct {
	Codex  SettingsCodex  `toml:"codex"`
	Limits SettingsLimits `toml:"limits"`
}

// SettingsCodex shapes the load.
type SettingsCodex struct {
	Include       []string `toml:"include"`         // gitignore-style patterns; only matching files load
	Exclude       []string `toml:"exclude"`         // gitignore-style patterns to leave out
	MaxFileBytes  int64    `toml:"max_file_bytes"`  // per-file cap
	MaxTotalBytes int64    `toml:"max_total_bytes"` // whole-tree cap
	Redact        *bool    `toml:"redact"`          // false turns secret redaction off, explicitly
	CAGRatio      float64  `toml:"cag_ratio"`       // share of the window the codex may fill whole
}

// SettingsLimits are the limits a codex may set; zero leaves the daemon's.
type SettingsLimits struct {
	MaxChars      int `toml:"max_chars"`
	AnswerReserve int `toml:"answer_reserve"`
	MaxDepth      int `toml:"max_depth"`
	CompactTo     int `toml:"compact_to"`
}

// Merge applies a codex's settings over the daemon's options: patterns
// add up, caps only tighten, and redaction goes off only when one of them
// says so explicitly.
func (o Options) Merge(s SettingsCodex) Options {
	o.Include = append(slices.Clone(o.Include), s.Include...)
	o.Exclude = append(slices.Clone(o.Exclude), s.Exclude...)
	if s.MaxFileBytes > 0 && (o.MaxFileBytes == 0 || s.MaxFileBytes < o.MaxFileBytes) {
		o.MaxFileBytes = s.MaxFileBytes
	}
	if s.MaxTotalBytes > 0 && (o.MaxTotalBytes == 0 || s.MaxTotalBytes < o.MaxTotalBytes) {
		o.MaxTotalBytes = s.MaxTotalBytes
	}
	if s.Redact != nil && !*s.Redact {
		o.NoRedact = true
	}
	return o
}

// LoadSettings reads SettingsFile from the codex root (the directory of a
// one-file codex). A missing file is not an error: found is false. With
// within, the root must lie beneath one of those directories (see
// Options.Within). The file is read only if it is a regular file in the
// root itself: a link (which could lead anywhere) is refused.
func LoadSettings(root string, within []AllowedDir) (s Settings, found bool, err error) {
	real, err := resolve(root)
	if errors.Is(err, fs.ErrNotExist) {
		return s, false, nil // no codex there (yet): the load says so
	}
	if err != nil {
		return s, false, fmt.Errorf("codex: %w", err)
	}
	dir, only := real, ""
	if info, err := os.Stat(real); err == nil && !info.IsDir() {
		dir, only = filepath.Dir(real), filepath.Base(real)
	}
	tree, err := openTreeRoot(dir, within, only)
	if err != nil {
		var out *OutsideError
		if errors.As(err, &out) {
			return s, false, ctxd.Errorf(ctxd.KindForbidden, "codex: %w", err)
		}
		return s, false, fmt.Errorf("codex: %w", err)
	}
	path := filepath.Join(dir, SettingsFile)
	data, err := readSettings(tree)
	if errors.Is(err, os.ErrNotExist) {
		return s, false, nil
	}
	if err != nil {
		return s, false, fmt.Errorf("codex: %s: %w", path, err)
	}
	md, err := toml.Decode(string(data), &s)
	if err != nil {
		return s, true, fmt.Errorf("codex: %s: %w", path, err)
	}
	if und := md.Undecoded(); len(und) > 0 {
		k := und[0]
		return s, true, fmt.Errorf("codex: %s:%d: unknown key %s", path, keyLine(string(data), k[len(k)-1]), k)
	}
	for key, v := range map[string]int64{
		"limits.max_chars": int64(s.Limits.MaxChars), "limits.answer_reserve": int64(s.Limits.AnswerReserve),
		"limits.max_depth": int64(s.Limits.MaxDepth), "limits.compact_to": int64(s.Limits.CompactTo),
		"codex.max_file_bytes": s.Codex.MaxFileBytes, "codex.max_total_bytes": s.Codex.MaxTotalBytes,
	} {
		if v < 0 {
			name := key[strings.LastIndex(key, ".")+1:]
			return s, true, fmt.Errorf("codex: %s:%d: %s = %d must not be negative", path, keyLine(string(data), name), key, v)
		}
	}
	if r := s.Codex.CAGRatio; !(r >= 0 && r <= 1) { // written so that NaN fails
		return s, true, fmt.Errorf("codex: %s:%d: codex.cag_ratio = %v must be between 0 and 1", path, keyLine(string(data), "cag_ratio"), r)
	}
	for _, p := range append(slices.Clone(s.Codex.Include), s.Codex.Exclude...) {
		if err := ValidatePatterns([]string{p}); err != nil {
			return s, true, fmt.Errorf("codex: %s: %w", path, err)
		}
	}
	return s, true, nil
}

// maxSettingsBytes caps what is read of a settings file.
const maxSettingsBytes = 1 << 20

// readSettings reads the settings file of the tree, refusing anything
// but a regular file in its root: a named pipe there would block every
// load, and the daemon's codex lock, until something wrote to it; a link
// could lead to any file the daemon may read.
func readSettings(tree *treeRoot) ([]byte, error) {
	f, _, err := openRegular(tree, SettingsFile)
	var swapped *notRegularError
	if errors.As(err, &swapped) && swapped.mode&fs.ModeSymlink != 0 {
		return nil, errors.New("a symbolic link: a codex's settings are read only from a regular file in its root (not followed)")
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxSettingsBytes+1))
	if err == nil && len(data) > maxSettingsBytes {
		err = fmt.Errorf("over %d bytes", maxSettingsBytes)
	}
	return data, err
}

// keyLine finds the line where key is assigned, for error messages; 0 if
// it cannot tell (the TOML decoder does not report key positions).
func keyLine(text, key string) int {
	re := regexp.MustCompile(`^\s*"?` + regexp.QuoteMeta(key) + `"?\s*=`)
	for i, line := range strings.Split(text, "\n") {
		if re.MatchString(line) {
			return i + 1
		}
	}
	return 0
}
