package runcontext

import (
	"strings"
	"testing"

	"github.com/ctxd/ctxd/runcontext/runcontexttest"
)

// clean makes s valid for a free-text field: valid UTF-8 without NUL
// bytes, not blank if required (Validate refuses the rest, and Render
// renders only what Validate accepts).
func clean(s string, required bool) string {
	s = strings.ToValidUTF8(strings.ReplaceAll(s, "\x00", ""), "\uFFFD")
	if required && strings.TrimSpace(s) == "" {
		s = "x" + s
	}
	return s
}

// unescape undoes escape: it removes the backslash escape put at the start
// of every line that needs one.
func unescape(t testing.TB, s string) string {
	t.Helper()
	var sb strings.Builder
	for start := 0; ; {
		end, next := nextBreak(s, start)
		line := s[start:end]
		if needsEscape(line) {
			if !strings.HasPrefix(line, `\`) {
				t.Fatalf("escaped text holds a line that needs escaping but is not escaped: %q", line)
			}
			line = line[1:]
		}
		sb.WriteString(line)
		if next < 0 {
			break
		}
		sb.WriteString(s[end:next])
		start = next
	}
	return sb.String()
}

// FuzzRenderCannotForge puts fuzzed text in every free-text field of a
// RunContext and checks that a lenient reader (package runcontexttest)
// finds exactly the structure ctxd wrote, in the plain rendering and with
// special token texts escaped; that rendering is deterministic and the
// next turn extends this one; and that escaping is reversible.
func FuzzRenderCannotForge(f *testing.F) {
	for _, s := range forgeries {
		f.Add(s, s, "ctxd", s, "k1", s, s, s, s, s, s, s, uint8(0))
	}
	f.Add("You are careful.", "", "ctxd", "~~~ file \"a\"\nx\n~~~\n", "k1", "note", "", "q", "a", "e", "q2", "art", uint8(3))
	f.Fuzz(func(t *testing.T, persona, instructions, name, body, karmaID, karmaText, summary, turnQuery, answer, excerpt, query, artifact string, block uint8) {
		rc := fixture()
		rc.Identity.Persona = clean(persona, true)
		rc.Sigil.Instructions = clean(instructions, false)
		if rc.Identity.Name = clean(name, true); len(rc.Identity.Name) > 64 || strings.ContainsAny(rc.Identity.Name, lineBreaks) {
			rc.Identity.Name = "ctxd"
		}
		rc.Codex.Body = clean(body, true)
		rc.Karma.Entries = []KarmaEntry{{ID: clean(karmaID, true), Text: clean(karmaText, true)}}
		rc.State.Summary = clean(summary, false)
		rc.State.Turns = []Turn{{Query: clean(turnQuery, true), Answer: clean(answer, false),
			Excerpts: []Excerpt{{Path: "a.go", Lines: "1-2", Text: clean(excerpt, true)}}}}
		rc.Query = Query{Text: clean(query, true), Excerpts: []Excerpt{{Path: "b/c.md", Text: clean(excerpt, true)}}}
		k := int(block) % NumBlocks
		rc.Artifacts = []Artifact{{Formatter: "fuzz", Block: k, Stable: k < BlockState, Text: clean(artifact, true)}}
		if k == BlockState {
			rc.Artifacts[0].Block = BlockQuery
		}
		if err := rc.Validate(); err != nil {
			t.Fatalf("the fuzzed RunContext is invalid: %v", err)
		}

		r := Render(rc)
		prompt := r.Prompt()
		checkStructure(t, rc, prompt)
		if again := Render(rc).Prompt(); again != prompt {
			t.Fatal("two renderings differ")
		}
		sp := Specials{"<|im_start|>", "<|eot_id|>", "<s>"}
		rc.Codex.Prerender(sp)
		escaped, _ := Plain{Special: sp}.Render(rc)
		checkStructure(t, rc, escaped.Prompt())

		// The next turn extends this one and its answer.
		next := *rc
		next.State.Turns = append(rc.State.Turns[:1:1], Turn{Query: rc.Query.Text, Excerpts: rc.Query.Excerpts, Answer: rc.State.Turns[0].Answer})
		next.Artifacts = nil
		rc.Artifacts = nil
		if p, n := Render(rc).Prompt()+RenderAnswer(rc.State.Turns[0].Answer), Render(&next).Prompt(); !strings.HasPrefix(n, p) {
			t.Fatalf("the next turn does not extend this one:\n%q\n%q", p, n)
		}

		for _, s := range []string{persona, body, karmaText, summary, answer, query, artifact} {
			s = clean(s, false)
			e := escape(s)
			if got := unescape(t, e); got != s {
				t.Fatalf("escaping is not reversible: %q escapes to %q, which unescapes to %q", s, e, got)
			}
			if m := runcontexttest.Markers(e); len(m) > 0 {
				t.Fatalf("%q escapes to %q, which holds the markers %q", s, e, m)
			}
		}
	})
}
