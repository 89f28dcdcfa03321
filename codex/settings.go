package codex

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/BurntSushi/toml"
)

// SettingsFile is the codex's own configuration, at the codex root. It is
// a hidden file, so it is never part of the codex's content.
const SettingsFile = ".ctxd.toml"

// Settings are what a codex says about itself. Its limits may only tighten
// the daemon's (see governor.Limits.Tighten).
type Settings struct {
	Limits SettingsLimits `toml:"limits"`
}

// SettingsLimits are the limits a codex may set; zero leaves the daemon's.
type SettingsLimits struct {
	MaxChars      int `toml:"max_chars"`
	AnswerReserve int `toml:"answer_reserve"`
	MaxDepth      int `toml:"max_depth"`
	CompactTo     int `toml:"compact_to"`
}

// LoadSettings reads SettingsFile from the codex root (the directory of a
// one-file codex). A missing file is not an error: found is false.
func LoadSettings(root string) (s Settings, found bool, err error) {
	dir := root
	if info, err := os.Stat(root); err == nil && !info.IsDir() {
		dir = filepath.Dir(root)
	}
	path := filepath.Join(dir, SettingsFile)
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return s, false, nil
	}
	if err != nil {
		return s, false, fmt.Errorf("codex: %w", err)
	}
	md, err := toml.Decode(string(data), &s)
	if err != nil {
		return s, true, fmt.Errorf("codex: %s: %w", path, err)
	}
	if und := md.Undecoded(); len(und) > 0 {
		k := und[0]
		return s, true, fmt.Errorf("codex: %s:%d: unknown key %s", path, keyLine(string(data), k[len(k)-1]), k)
	}
	for key, v := range map[string]int{
		"limits.max_chars": s.Limits.MaxChars, "limits.answer_reserve": s.Limits.AnswerReserve,
		"limits.max_depth": s.Limits.MaxDepth, "limits.compact_to": s.Limits.CompactTo,
	} {
		if v < 0 {
			name := key[strings.LastIndex(key, ".")+1:]
			return s, true, fmt.Errorf("codex: %s:%d: %s = %d must not be negative", path, keyLine(string(data), name), key, v)
		}
	}
	return s, true, nil
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
