package secrets

import (
	"io/fs"
	"testing"
	"testing/fstest"
)

// TestVersionFollowsTheRulesSource: the rules' version (which keys every
// cached redaction) changes with any change to the package's code or
// data, with no constant bumped by hand; a change to a test does not
// change it.
func TestVersionFollowsTheRulesSource(t *testing.T) {
	files, err := fs.Glob(source, "*.go")
	if err != nil || len(files) < 3 {
		t.Fatalf("embedded source: %v, %v", files, err)
	}
	tree := fstest.MapFS{}
	for _, name := range files {
		data, err := source.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		tree[name] = &fstest.MapFile{Data: data}
	}
	base := rulesHashOf(tree, gitleaksTOML)
	if base != rulesHash() {
		t.Fatalf("the hash of a copy of the source %s differs from the build's %s", base, rulesHash())
	}
	edit := func(name string, f func([]byte) []byte) string {
		t.Helper()
		saved := tree[name].Data
		defer func() { tree[name].Data = saved }()
		tree[name].Data = f(append([]byte(nil), saved...))
		return rulesHashOf(tree, gitleaksTOML)
	}
	// A rule's expression changed by one character, with no version bump.
	if got := edit("own.go", func(b []byte) []byte { return append(b, ' ') }); got == base {
		t.Error("own.go changed and the rules' version did not")
	}
	if got := edit("scan.go", func(b []byte) []byte { return b[:len(b)-1] }); got == base {
		t.Error("scan.go changed and the rules' version did not")
	}
	if got := rulesHashOf(tree, append([]byte("# x\n"), gitleaksTOML...)); got == base {
		t.Error("gitleaks.toml changed and the rules' version did not")
	}
	if got := edit("version_test.go", func(b []byte) []byte { return append(b, ' ') }); got != base {
		t.Error("a test changed and the rules' version changed with it")
	}
	// A new file of rules counts too.
	tree["extra.go"] = &fstest.MapFile{Data: []byte("package secrets\n")}
	if got := rulesHashOf(tree, gitleaksTOML); got == base {
		t.Error("a file added to the package and the rules' version did not change")
	}
}
