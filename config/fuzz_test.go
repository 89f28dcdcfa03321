package config

import (
	"bytes"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/BurntSushi/toml"
)

// FuzzLoad loads any file as the configuration. It is refused with an
// error that names the file, or it loads; a configuration that loads is
// refused by Validate with errors that each name a field, or it is valid:
// its numbers are finite and in range, and written back as TOML it loads
// to the same configuration, valid again.
func FuzzLoad(f *testing.F) {
	for _, name := range []string{"../ctxd.toml", "../ctxd-llamacpp.toml"} {
		if b, err := os.ReadFile(name); err == nil {
			f.Add(string(b))
		}
	}
	for _, s := range []string{
		"",
		"[daemon]\nstate_dir = \"var/state\"\n[backend]\nbinary = \"bin/ollama\"\n",
		"[codex]\ncag_ratio = nan\n",
		"[backend]\ntemperature = inf\n",
		"[backend]\ntemperature = -0.0\nseed = -1\n",
		"[daemon]\nshutdown_grace = \"1h\"\nbody_timeout = \"-1s\"\n",
		"[daemon]\ntcp_listen = \"0.0.0.0:11435\"\n[sigils.agent]\nscopes = [\"ask\"]\ntoken_sha256 = \"" + strings.Repeat("ab", 32) + "\"\n",
		"[sigils.\"Bad Name\"]\nscopes = [\"ask\", \"tool:\", \"root\"]\n",
		"[sigils.default]\nscopes = [\"ask\"]\nuids = [-1]\n",
		"[environment]\nvram_high_enter = 0.5\nvram_moderate_enter = 0.9\n",
		"[codex]\ninclude = [\"[\"]\nload_roots = [\"rel\", \"~/x\"]\n",
		"[limits]\ncompact_to = 40\nmax_depth = 4\n",
		"[daemon]\nsocket = \"" + strings.Repeat("s", 120) + "\"\n",
		"[backend]\nkind = \"llamacpp\"\nmode = \"managed\"\nlisten = \"/tmp/l.sock\"\n",
		"[daemon]\nunknown = 1\n",
		"[[daemon]]\n",
		"daemon = 5\n",
	} {
		f.Add(s)
	}
	dir := f.TempDir()
	path := filepath.Join(dir, "ctxd.toml")
	env := Env{UID: 1000, Home: "/home/u"}
	load := func(t *testing.T, data []byte) (Config, error) {
		t.Helper()
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		return Load(path, env)
	}
	f.Fuzz(func(t *testing.T, data string) {
		c, err := load(t, []byte(data))
		if err != nil {
			if !strings.HasPrefix(err.Error(), "config: "+path+": ") {
				t.Fatalf("%q: the error does not name the file: %v", data, err)
			}
			return
		}
		if err := c.Validate(); err != nil {
			for line := range strings.Lines(err.Error()) {
				if !strings.HasPrefix(line, "config: ") || !strings.Contains(strings.TrimPrefix(line, "config: "), ": ") {
					t.Fatalf("%q: the error %q does not name a field", data, line)
				}
			}
			return
		}
		checkValid(t, data, c)
		var b bytes.Buffer
		if err := toml.NewEncoder(&b).Encode(c); err != nil {
			t.Fatalf("%q: the valid configuration does not encode: %v", data, err)
		}
		again, err := load(t, b.Bytes())
		if err != nil {
			t.Fatalf("%q: the valid configuration, written as\n%s\ndoes not load: %v", data, b.String(), err)
		}
		if err := again.Validate(); err != nil {
			t.Fatalf("%q: the valid configuration, written as\n%s\nis not valid: %v", data, b.String(), err)
		}
		if !reflect.DeepEqual(sameEmpty(c), sameEmpty(again)) {
			t.Fatalf("%q: the valid configuration, written as\n%s\nloads as another:\n%+v\n%+v", data, b.String(), c, again)
		}
	})
}

// checkValid fails unless a valid configuration's numbers are what
// Validate promises: finite, and in their ranges.
func checkValid(t *testing.T, data string, c Config) {
	t.Helper()
	floats := map[string]float64{
		"codex.cag_ratio": c.Codex.CAGRatio, "backend.temperature": c.Backend.Temperature,
		"environment.vram_moderate_enter": c.Env.VRAMModerateEnter, "environment.vram_moderate_leave": c.Env.VRAMModerateLeave,
		"environment.vram_high_enter": c.Env.VRAMHighEnter, "environment.vram_high_leave": c.Env.VRAMHighLeave,
		"environment.vram_critical_enter": c.Env.VRAMCriticalEnter, "environment.vram_critical_leave": c.Env.VRAMCriticalLeave,
		"environment.low_battery_enter": c.Env.LowBatteryEnter, "environment.low_battery_leave": c.Env.LowBatteryLeave,
	}
	for field, v := range floats {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			t.Fatalf("%q: valid with %s = %v", data, field, v)
		}
	}
	switch {
	case !(c.Codex.CAGRatio > 0 && c.Codex.CAGRatio <= 1):
		t.Fatalf("%q: valid with codex.cag_ratio = %v", data, c.Codex.CAGRatio)
	case c.Backend.Temperature < 0:
		t.Fatalf("%q: valid with backend.temperature = %v", data, c.Backend.Temperature)
	case c.Daemon.MaxBodyBytes < 1024 || c.Backend.Slots < 1 || c.Limits.AnswerReserve < 1 || c.Codex.TopK < 1:
		t.Fatalf("%q: valid with a size out of range: %+v", data, c)
	case c.Daemon.Socket == "" || len(c.Daemon.Socket) > 100 || !filepath.IsAbs(c.Daemon.StateDir):
		t.Fatalf("%q: valid with socket %q and state_dir %q", data, c.Daemon.Socket, c.Daemon.StateDir)
	}
	if _, ok := c.Sigils[c.Daemon.DefaultSigil]; !ok {
		t.Fatalf("%q: valid without its default sigil %q", data, c.Daemon.DefaultSigil)
	}
}

// sameEmpty is c with its empty lists made nil: TOML writes no key for a
// nil list and an empty array for an empty one, which mean the same here.
func sameEmpty(c Config) Config {
	nilIfEmpty := func(s *[]string) {
		if len(*s) == 0 {
			*s = nil
		}
	}
	nilIfEmpty(&c.Codex.Include)
	nilIfEmpty(&c.Codex.Exclude)
	nilIfEmpty(&c.Codex.LoadRoots)
	sigils := make(map[string]Sigil, len(c.Sigils))
	for name, s := range c.Sigils {
		nilIfEmpty(&s.Scopes)
		nilIfEmpty(&s.RevokedSHA256)
		if len(s.UIDs) == 0 {
			s.UIDs = nil
		}
		if len(s.GIDs) == 0 {
			s.GIDs = nil
		}
		sigils[name] = s
	}
	c.Sigils = sigils
	return c
}
