package governor

import (
	"errors"
	"strings"
	"testing"

	"github.com/ctxd/ctxd/runcontext"
)

func rendered() runcontext.Rendered {
	var r runcontext.Rendered
	for k := range r.Blocks {
		r.Blocks[k] = strings.Repeat("x", 10*(k+1))
	}
	return r // 280 chars
}

func TestCheck(t *testing.T) {
	cases := []struct {
		name   string
		limits Limits
		tokens int
		limit  string
	}{
		{"fits", Limits{MaxChars: 1000, NumCtx: 100, AnswerReserve: 20}, 80, ""},
		{"char cap", Limits{MaxChars: 279, NumCtx: 100, AnswerReserve: 20}, 10, "max_chars"},
		{"window", Limits{NumCtx: 100, AnswerReserve: 20}, 81, "num_ctx"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if err := c.limits.Validate(); err != nil {
				t.Fatal(err)
			}
			b, err := c.limits.Check(Measure{Rendered: rendered(), PromptTokens: c.tokens, BlockTokens: [7]int{1, 2, 3, 4, 5, 6, 7},
				KVBytes: func(n int) int64 { return int64(n) * 10 }})
			if b.Chars != 280 || len(b.Blocks) != runcontext.NumBlocks || b.Blocks[6].Tokens != 7 ||
				b.KVBytes != int64(c.tokens+20)*10 || b.KVBudgetBytes != 1000 {
				t.Errorf("budget %+v", b)
			}
			var le *LimitError
			if c.limit == "" {
				if err != nil {
					t.Fatalf("unexpected error %v", err)
				}
				return
			}
			if !errors.As(err, &le) || le.Limit != c.limit {
				t.Fatalf("error %v, want limit %s", err, c.limit)
			}
			if !strings.Contains(err.Error(), "query=70/7") {
				t.Errorf("message lacks per-block numbers: %v", err)
			}
		})
	}
}

func TestValidate(t *testing.T) {
	for _, l := range []Limits{{NumCtx: 0, AnswerReserve: 1}, {NumCtx: 10, AnswerReserve: 10}, {MaxChars: -1, NumCtx: 10, AnswerReserve: 1}} {
		if err := l.Validate(); err == nil {
			t.Errorf("%+v accepted", l)
		}
	}
}

func TestPlanCodex(t *testing.T) {
	l := Limits{NumCtx: 8192, AnswerReserve: 192} // budget 8000, threshold 5600 at 0.7
	cases := []struct {
		stable    int
		codex     int64
		ratio     float64
		room      int
		mode      string
		threshold int
	}{
		{5600, 5000, 0, 0, "cag", 5600},
		{5601, 5000, 0, 0, "rag", 5600},
		{-1, 900000, 0.7, 0, "rag", 5600},
		{3000, 2500, 0.3, 0, "rag", 2400},  // a codex TOML that lowers the ratio
		{5600, 5000, 0, 2000, "cag", 5600}, // the room the ratio leaves is enough
		{5600, 5000, 0, 3000, "rag", 5000}, // a client's prompt needs more: the codex's share shrinks
		{100, 50, 0, 9000, "rag", 0},
	}
	for _, c := range cases {
		p := l.PlanCodex(c.stable, c.codex, c.ratio, c.room)
		if p.Mode != c.mode || p.Threshold != c.threshold || p.Reason == "" || (c.room > 2400) != strings.Contains(p.Reason, "clients' own prompts") {
			t.Errorf("PlanCodex(%d, %d, %v, %d) = %+v, want %s under %d", c.stable, c.codex, c.ratio, c.room, p, c.mode, c.threshold)
		}
	}
}
