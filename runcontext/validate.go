package runcontext

import (
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"regexp"
	"slices"
	"strings"
	"unicode/utf8"
)

// FieldError says which field of a RunContext is bad and why.
type FieldError struct {
	Field   string // JSON path, e.g. "state.turns[2].query"
	Problem string
}

func (e *FieldError) Error() string {
	return fmt.Sprintf("runcontext: %s: %s", e.Field, e.Problem)
}

var (
	sigilNameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,63}$`)
	scopeRE     = regexp.MustCompile(`^[a-z][a-z0-9_.:-]{0,63}$`)
	sha256RE    = regexp.MustCompile(`^[0-9a-f]{64}$`)
	linesRE     = regexp.MustCompile(`^[0-9]+-[0-9]+$`)
)

// Enumerations of the environment bands.
var (
	VRAMBands         = []string{"unknown", "low", "moderate", "high", "critical"}
	GPUStates         = []string{"unknown", "none", "present"}
	PowerStates       = []string{"unknown", "ac", "battery", "low_battery", "low_power"}
	ConnectivityBands = []string{"unknown", "offline", "online"}
)

// ToolNameRE is what a client tool's name must look like (OpenAI's rule).
var ToolNameRE = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,64}$`)

// FormatterNameRE is what a formatter's name must look like.
var FormatterNameRE = regexp.MustCompile(`^[a-z][a-z0-9_.-]{0,63}$`)

// CheckArtifact says whether a formatter of that name may inject an
// artifact into block k, stable or volatile: nil if it may, else the
// problems, each a *FieldError. A stable artifact joins one of the stable
// blocks, identity to karma (the state is the conversation, kept as it
// was said); a volatile one joins the query block, and names it, so that
// no volatile text can change a byte of the prefix.
func CheckArtifact(formatter string, k int, stable bool) error {
	var v validator
	v.placement("artifact", formatter, k, stable)
	return errors.Join(v.errs...)
}

// Validate checks every block and returns all problems found, each a
// *FieldError naming its field, joined; nil if the RunContext is valid.
func (rc *RunContext) Validate() error {
	var v validator
	v.name("identity.name", rc.Identity.Name, 64)
	v.text("identity.persona", rc.Identity.Persona, true)

	if !rc.Codex.bodyValid {
		v.codex(rc.Codex)
	}

	e := rc.Environment
	v.enum("environment.vram", e.VRAM, VRAMBands)
	v.enum("environment.gpu", e.GPU, GPUStates)
	v.enum("environment.power", e.Power, PowerStates)
	v.enum("environment.connectivity", e.Connectivity, ConnectivityBands)

	if !sigilNameRE.MatchString(rc.Sigil.Name) {
		v.fail("sigil.name", fmt.Sprintf("%q must match %s", rc.Sigil.Name, sigilNameRE))
	}
	for i, s := range rc.Sigil.Scopes {
		field := fmt.Sprintf("sigil.scopes[%d]", i)
		if !scopeRE.MatchString(s) {
			v.fail(field, fmt.Sprintf("%q must match %s", s, scopeRE))
		}
		if i > 0 && rc.Sigil.Scopes[i-1] >= s {
			v.fail(field, "scopes must be sorted and unique")
		}
	}

	v.text("sigil.instructions", rc.Sigil.Instructions, false)
	if f := rc.Sigil.ToolFormat; f != "" && f != ToolFormatTemplate {
		v.fail("sigil.tool_format", fmt.Sprintf("%q: want %q or empty", f, ToolFormatTemplate))
	}
	for i, tool := range rc.Sigil.Tools {
		if !scopeRE.MatchString(tool) {
			v.fail(fmt.Sprintf("sigil.tools[%d]", i), fmt.Sprintf("%q must match %s", tool, scopeRE))
		}
	}
	for i, t := range rc.Sigil.ClientTools {
		field := fmt.Sprintf("sigil.client_tools[%d]", i)
		if !ToolNameRE.MatchString(t.Name) {
			v.fail(field+".name", fmt.Sprintf("%q must match %s", t.Name, ToolNameRE))
		}
		v.text(field+".description", t.Description, false)
		if t.Parameters != "" && (!json.Valid([]byte(t.Parameters)) || strings.ContainsAny(t.Parameters, "\n\r")) {
			v.fail(field+".parameters", "must be compact JSON")
		}
	}
	if rc.Karma.Epoch < 0 {
		v.fail("karma.epoch", "must not be negative")
	}
	ids := map[string]bool{}
	for i, k := range rc.Karma.Entries {
		field := fmt.Sprintf("karma.entries[%d]", i)
		v.text(field+".id", k.ID, true)
		if ids[k.ID] {
			v.fail(field+".id", fmt.Sprintf("duplicate id %q", k.ID))
		}
		ids[k.ID] = true
		v.text(field+".text", k.Text, true)
	}

	if rc.State.Epoch < 0 {
		v.fail("state.epoch", "must not be negative")
	}
	if !utf8.ValidString(rc.State.Summary) {
		v.fail("state.summary", "is not valid UTF-8")
	}
	for i, t := range rc.State.Turns {
		field := fmt.Sprintf("state.turns[%d]", i)
		v.text(field+".query", t.Query, true)
		// Answers are what the model said, byte for byte (the backend's KV
		// cache holds exactly that); only invalid UTF-8 is refused.
		if !utf8.ValidString(t.Answer) {
			v.fail(field+".answer", "is not valid UTF-8")
		}
		v.excerpts(field+".excerpts", t.Excerpts)
	}

	v.text("query.text", rc.Query.Text, true)
	v.excerpts("query.excerpts", rc.Query.Excerpts)

	for i, a := range rc.Artifacts {
		field := fmt.Sprintf("artifacts[%d]", i)
		v.placement(field, a.Formatter, a.Block, a.Stable)
		v.text(field+".text", a.Text, true)
	}
	return errors.Join(v.errs...)
}

// placement checks an artifact's formatter name and where it goes.
func (v *validator) placement(field, formatter string, k int, stable bool) {
	if !FormatterNameRE.MatchString(formatter) {
		v.fail(field+".formatter", fmt.Sprintf("%q must match %s", formatter, FormatterNameRE))
	}
	switch {
	case k < 0 || k >= NumBlocks:
		v.fail(field+".block", fmt.Sprintf("%d is not a block (0 %s to %d %s)", k, BlockNames[0], NumBlocks-1, BlockNames[NumBlocks-1]))
	case stable && k >= BlockState:
		v.fail(field+".block", fmt.Sprintf("a stable artifact joins a stable block (%d %s to %d %s), not the %s block",
			BlockIdentity, BlockNames[BlockIdentity], BlockKarma, BlockNames[BlockKarma], BlockNames[k]))
	case !stable && k != BlockQuery:
		v.fail(field+".block", fmt.Sprintf("a volatile artifact joins the query block (%d), not the %s block: it must not change the prefix",
			BlockQuery, BlockNames[k]))
	}
}

type validator struct{ errs []error }

// codex checks the codex block; Prerender runs it once per codex.
func (v *validator) codex(c Codex) {
	v.text("codex.name", c.Name, false)
	if strings.HasPrefix(c.Name, "/") {
		v.fail("codex.name", "must not be an absolute path")
	}
	switch c.Mode {
	case ModeNone:
		if len(c.Files) > 0 || c.Body != "" {
			v.fail("codex.mode", `is "none" but files or body are set`)
		}
	case ModeCAG, ModeRAG:
		v.text("codex.body", c.Body, true)
	default:
		v.fail("codex.mode", fmt.Sprintf("%q is not one of none, cag, rag", c.Mode))
	}
	seen := make(map[string]bool, len(c.Files))
	for i, f := range c.Files {
		field := fmt.Sprintf("codex.files[%d]", i)
		v.relPath(field+".path", f.Path)
		if seen[f.Path] {
			v.fail(field+".path", "files must be unique")
		}
		seen[f.Path] = true
		if f.Bytes < 0 {
			v.fail(field+".bytes", "must not be negative")
		}
		if !sha256RE.MatchString(f.SHA256) {
			v.fail(field+".sha256", "must be 64 lowercase hex digits")
		}
	}

}

func (v *validator) fail(field, problem string) {
	v.errs = append(v.errs, &FieldError{Field: field, Problem: problem})
}

// text checks s is valid UTF-8 without NUL bytes, and non-blank if required.
func (v *validator) text(field, s string, required bool) {
	switch {
	case required && strings.TrimSpace(s) == "":
		v.fail(field, "must not be empty")
	case !utf8.ValidString(s):
		v.fail(field, "is not valid UTF-8")
	case strings.IndexByte(s, 0) >= 0:
		v.fail(field, "contains a NUL byte")
	}
}

func (v *validator) name(field, s string, max int) {
	v.text(field, s, true)
	if len(s) > max {
		v.fail(field, fmt.Sprintf("is %d bytes, at most %d allowed", len(s), max))
	}
	if strings.ContainsAny(s, lineBreaks) {
		v.fail(field, "must be a single line")
	}
}

func (v *validator) enum(field, s string, allowed []string) {
	if !slices.Contains(allowed, s) {
		v.fail(field, fmt.Sprintf("%q is not one of %s", s, strings.Join(allowed, ", ")))
	}
}

func (v *validator) relPath(field, p string) {
	switch {
	case p == "":
		v.fail(field, "must not be empty")
	case strings.HasPrefix(p, "/"):
		v.fail(field, "must be relative to the codex root")
	case path.Clean(p) != p || p == ".." || strings.HasPrefix(p, "../"):
		v.fail(field, fmt.Sprintf("%q is not a clean path inside the codex", p))
	case strings.ContainsAny(p, "\x00\r\n"):
		v.fail(field, "contains a control character")
	}
}

func (v *validator) excerpts(field string, ex []Excerpt) {
	for i, e := range ex {
		f := fmt.Sprintf("%s[%d]", field, i)
		v.relPath(f+".path", e.Path)
		v.text(f+".text", e.Text, true)
		if e.Lines != "" && !linesRE.MatchString(e.Lines) {
			v.fail(f+".lines", fmt.Sprintf("%q must look like 12-40", e.Lines))
		}
	}
}
