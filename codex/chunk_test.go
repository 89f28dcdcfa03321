package codex

import (
	"fmt"
	"strings"
	"testing"
)

func TestChunkAtFunctionsAndHeadings(t *testing.T) {
	goSrc := "package p\n\nimport \"fmt\"\n\n// A does a.\nfunc A() {\n\tfmt.Println(1)\n}\n\n// B does b.\nfunc B() {}\n"
	var starts []int
	for _, c := range chunkFile("p.go", goSrc) {
		starts = append(starts, c.Start)
	}
	if got := fmt.Sprint(starts); got != "[1 5 10]" {
		t.Errorf("Go chunks start at %v, want 1,5,10 (declarations with their comments)", starts)
	}
	md := "# T\nintro\n## A\ntext a\n## B\ntext b\n"
	if n := len(chunkFile("r.md", md)); n != 3 {
		t.Errorf("markdown: %d chunks, want 3", n)
	}
	long := strings.Repeat("a line of prose that goes on\n", 200)
	for _, c := range chunkFile("x.txt", long) {
		if len(c.Text) > maxChunkChars {
			t.Errorf("chunk of %d chars over the cap", len(c.Text))
		}
	}
	// Chunks cover every line exactly once.
	total := 0
	for _, c := range chunkFile("p.go", goSrc) {
		total += c.End - c.Start + 1
	}
	if total != strings.Count(goSrc, "\n") {
		t.Errorf("chunks cover %d lines of %d", total, strings.Count(goSrc, "\n"))
	}
}

func TestMapFitsItsBudget(t *testing.T) {
	c := &Codex{Name: "big"}
	for i := range 300 {
		c.Files = append(c.Files, File{Path: fmt.Sprintf("pkg%d/sub%d/file%d.go", i%7, i%13, i), Lines: 12, Size: 345})
	}
	full := c.Map(0)
	if !strings.Contains(full, "\"pkg0/sub0/file0.go\"\n") || strings.Count(full, "\n") != 302 {
		t.Errorf("uncapped map lacks files:\n%.300s", full)
	}
	if c.Totals() != "The codex holds 300 files, 3600 lines, 103500 bytes.\n" {
		t.Errorf("totals: %q", c.Totals())
	}
	capped := c.Map(1200)
	if len(capped) > 1200 || !strings.Contains(capped, "Directories") || !strings.Contains(capped, "\"pkg0\" 43\n") {
		t.Errorf("capped map (%d chars):\n%s", len(capped), capped)
	}
	// An edit (new sizes) changes nothing in the map.
	c.Files[0].Lines, c.Files[0].Size = 13, 400
	if c.Map(0) != full || c.Map(1200) != capped {
		t.Error("the map changed when a file's size did")
	}
}
