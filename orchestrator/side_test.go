package orchestrator

import (
	"strings"
	"testing"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/governor"
	"github.com/ctxd/ctxd/internal/fake"
	"github.com/ctxd/ctxd/runcontext"
	"github.com/ctxd/ctxd/scheduler"
	"github.com/ctxd/ctxd/sigils"
	"github.com/ctxd/ctxd/tokencount"
)

// TestSideRequestsAndTheMainSlot: an agent's side request (a session of
// its own) between two turns of its conversation. Where ctxd picks the
// slot (llama-server) and there are two, the side request takes the other
// one and the conversation keeps its cache; on one slot it cannot, and
// the conversation's next turn says who went between and that its own
// tokens were evaluated again.
func TestSideRequestsAndTheMainSlot(t *testing.T) {
	t.Parallel()
	for _, slots := range []int{1, 2} {
		reg, err := sigils.NewRegistry(map[string][]string{"default": {"ask"}}, "default")
		if err != nil {
			t.Fatal(err)
		}
		backend := fake.NewBackend()
		o, err := New(Config{Identity: runcontext.Identity{Name: "t", Persona: "Be brief."}, Limits: governor.Limits{NumCtx: 100000, AnswerReserve: 64}, Sigils: reg},
			backend, tokencount.New(fake.Tokenizer{}, nil), fake.NewStore(), fake.NewSensor(), scheduler.New(scheduler.Options{Slots: slots, LeastRecentTies: true}))
		if err != nil {
			t.Fatal(err)
		}
		ask := func(session, query string) *ctxd.Summary {
			t.Helper()
			sum, err := o.Ask(t.Context(), ctxd.AskRequest{Session: session, Query: query}, noop)
			if err != nil {
				t.Fatal(err)
			}
			return sum
		}
		first := ask("main", "a first question about the code")
		ask("title", "Title this conversation.")
		next := ask("main", "a second question")
		switch slots {
		case 1:
			if !strings.Contains(next.SlotNote, `"title"`) || next.CachedTokens >= first.PromptTokens {
				t.Errorf("one slot: note %q, %d cached of the first prompt's %d", next.SlotNote, next.CachedTokens, first.PromptTokens)
			}
		case 2:
			if next.SlotNote != "" || next.CachedTokens < first.PromptTokens {
				t.Errorf("two slots: the side request displaced the conversation: note %q, %d cached of %d", next.SlotNote, next.CachedTokens, first.PromptTokens)
			}
		}
	}
}
