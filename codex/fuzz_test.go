package codex

import (
	"bytes"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/BurntSushi/toml"
)

// FuzzLoadSettings loads any file as a codex's .ctxd.toml. It is refused
// with an error that names the file, or its settings are what the daemon
// may apply: no negative cap or limit, a CAG ratio between 0 and 1,
// patterns that compile; and written back as TOML they load the same.
func FuzzLoadSettings(f *testing.F) {
	for _, s := range []string{
		"[limits]\nmax_depth = 10\nanswer_reserve = 64\n",
		"[codex]\ninclude = [\"*.go\", \"docs/**\"]\nexclude = [\"!vendor\"]\nmax_file_bytes = 65536\nmax_total_bytes = 1048576\nredact = false\ncag_ratio = 0.5\n",
		"[limits]\nmax_depth = 10\n\nmax_detph = 3\n",
		"[limits]\nmax_chars = -5\n",
		"[codex]\ncag_ratio = nan\n",
		"[codex]\ncag_ratio = -inf\n",
		"[codex]\ninclude = [\"[\"]\n",
		"[codex]\nexclude = [\"  \"]\n",
		"[limits]\nmax_chars = 9223372036854775807\n",
		"[limits\n",
		"codex = 1\n",
		"\"limits\".\"max_depth\" = 3\n",
		"",
	} {
		f.Add(s)
	}
	dir := f.TempDir()
	path := filepath.Join(dir, SettingsFile)
	load := func(t *testing.T, data []byte) (Settings, error) {
		t.Helper()
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		s, found, err := LoadSettings(dir, nil)
		if !found && err == nil {
			t.Fatalf("%s is there, and not found", path)
		}
		return s, err
	}
	f.Fuzz(func(t *testing.T, data string) {
		s, err := load(t, []byte(data))
		if err != nil {
			if !strings.HasPrefix(err.Error(), "codex: "+path) {
				t.Fatalf("%q: the error does not name the file: %v", data, err)
			}
			return
		}
		l, c := s.Limits, s.Codex
		if l.MaxChars < 0 || l.AnswerReserve < 0 || l.MaxDepth < 0 || l.CompactTo < 0 || c.MaxFileBytes < 0 || c.MaxTotalBytes < 0 {
			t.Fatalf("%q: taken with a negative number: %+v", data, s)
		}
		if !(c.CAGRatio >= 0 && c.CAGRatio <= 1) {
			t.Fatalf("%q: taken with cag_ratio %v", data, c.CAGRatio)
		}
		if err := ValidatePatterns(append(append([]string{}, c.Include...), c.Exclude...)); err != nil {
			t.Fatalf("%q: taken with a bad pattern: %v", data, err)
		}
		var b bytes.Buffer
		if err := toml.NewEncoder(&b).Encode(s); err != nil {
			t.Fatalf("%q: the settings %+v do not encode: %v", data, s, err)
		}
		again, err := load(t, b.Bytes())
		if err != nil {
			t.Fatalf("%q: the settings, written as\n%s\ndo not load: %v", data, b.String(), err)
		}
		if !reflect.DeepEqual(noEmptyLists(s), noEmptyLists(again)) {
			t.Fatalf("%q: the settings, written as\n%s\nload as others: %+v, %+v", data, b.String(), s, again)
		}
	})
}

// noEmptyLists is s with its empty pattern lists made nil: they mean the
// same, and TOML writes no key for a nil list.
func noEmptyLists(s Settings) Settings {
	if len(s.Codex.Include) == 0 {
		s.Codex.Include = nil
	}
	if len(s.Codex.Exclude) == 0 {
		s.Codex.Exclude = nil
	}
	return s
}
