package integration

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/bringup"
	"github.com/ctxd/ctxd/config"
	"github.com/ctxd/ctxd/hostenv"
	"github.com/ctxd/ctxd/httpapi"
	"github.com/ctxd/ctxd/persona"
)

// TestPersonasUnderOneBudget serves three personas over two models on
// managed llama-servers, under a memory budget that holds two at a time.
// Asks that go round them evacuate the persona idle longest (its slot
// saved, its server stopped) and restore it on its next ask: the
// conversation comes back whole (the server reuses the whole previous
// prompt), the planned memory never passes the budget, nothing is
// refused, and the doors list and route by persona.
func TestPersonasUnderOneBudget(t *testing.T) {
	needLlamaServer(t)
	chatml, llama3 := templatedModels()[0], templatedModels()[1]
	state := t.TempDir()
	cfg := llamaConfig(t, state, codexDir(t, 3000))
	cfg.Backend.GGUF, cfg.Backend.Model, cfg.Backend.NumCtx = modelPath(t, chatml), chatml.Name, 4096
	cfg.Personas = []config.Persona{
		{Name: "reviewer", Persona: "You review code and name what is wrong with it."},
		{Name: "writer", GGUF: modelPath(t, llama3), Persona: "You write documentation."},
	}
	// A budget that holds the default and one other, never all three.
	planA := plannedBytes(t, cfg, cfg.Backend.GGUF)
	planB := plannedBytes(t, cfg, cfg.Personas[1].GGUF)
	cfg.Limits.MemoryBudgetMB = int((planA+max(planA, planB))>>20) + 1
	t.Logf("planned: %d MiB (chatml), %d MiB (llama3); budget %d MiB", planA>>20, planB>>20, cfg.Limits.MemoryBudgetMB)
	d := start(t, cfg, true)
	ctx := context.Background()

	var prev = map[string]*ctxd.Summary{}
	askAs := func(name, session, q string) *ctxd.Summary {
		t.Helper()
		var progress []string
		sum, err := d.client.Ask(ctx, ctxd.AskRequest{Session: session, Query: q, Persona: name}, nil)
		if err != nil {
			t.Fatalf("%s: ask %q: %v", name, q, err)
		}
		measured := -1
		if sum.BackendCachedTokens != nil {
			measured = *sum.BackendCachedTokens
		}
		t.Logf("%s/%s %q: %d prompt tokens, %d cached (measured %d), ttft %.0f ms %v", name, session, q, sum.PromptTokens, sum.CachedTokens, measured, sum.TTFTMillis, progress)
		if p := prev[session]; p != nil && sum.DoneReason != ctxd.DoneIncomplete {
			if sum.CachedTokens != p.PromptTokens || measured < sum.CachedTokens {
				t.Errorf("%s/%s: %d cached (measured %d), want the previous prompt's %d: the conversation did not come back whole", name, session, sum.CachedTokens, measured, p.PromptTokens)
			}
		}
		prev[session] = sum
		return sum
	}
	status := func() *httpapi.PersonasStatus {
		t.Helper()
		var st httpapi.Status
		if err := d.client.GetJSON(ctx, "/v1/status", &st); err != nil {
			t.Fatal(err)
		}
		if st.Personas == nil {
			t.Fatal("status shows no personas")
		}
		if st.Personas.PlannedBytes > st.Personas.BudgetBytes {
			t.Errorf("planned %d bytes over the budget of %d", st.Personas.PlannedBytes, st.Personas.BudgetBytes)
		}
		return st.Personas
	}
	states := func(ps *httpapi.PersonasStatus) map[string]persona.State {
		m := map[string]persona.State{}
		for _, p := range ps.Personas {
			m[p.Name] = p.State
		}
		return m
	}

	askAs("", "a", "What does Handler3 return?")
	askAs("reviewer", "r", "Review Handler3.")
	if s := states(status()); s[chatml.Name] != persona.Resident || s["reviewer"] != persona.Resident || s["writer"] != persona.Cold {
		t.Fatalf("after two personas: %v", s)
	}
	askAs("writer", "w", "Document Handler3.")
	if s := states(status()); s[chatml.Name] != persona.Evacuated || s["reviewer"] != persona.Resident || s["writer"] != persona.Resident {
		t.Fatalf("the writer's load should have evacuated the default persona, idle longest: %v", s)
	}
	// Back to the default: restored from disk, its conversation whole.
	askAs(chatml.Name, "a", "And Handler4?")
	askAs("writer", "w", "And Handler4?")
	askAs("reviewer", "r", "And Handler4?")
	ps := status()
	evacuations, restores := 0, 0
	for _, p := range ps.Personas {
		evacuations += p.Evacuations
		restores += p.Restores
		if p.State == persona.Resident && p.RSS <= 0 {
			t.Errorf("persona %s is resident but its server's memory reads %d", p.Name, p.RSS)
		}
		t.Logf("persona %+v", p)
	}
	for _, p := range ps.Personas {
		if p.State == persona.Evacuated && (p.SavedSlots != 1 || p.SavedTokens == 0 || p.SavedBytes == 0) {
			t.Errorf("persona %s is evacuated, and status shows on disk %d slots, %d tokens, %d bytes: want its slot", p.Name, p.SavedSlots, p.SavedTokens, p.SavedBytes)
		}
	}
	if evacuations < 2 || restores < 2 {
		t.Errorf("%d evacuations, %d restores: want at least two of each", evacuations, restores)
	}

	// The doors list the personas and route by the model field.
	var models struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if err := d.client.GetJSON(ctx, "/v1/models", &models); err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, m := range models.Data {
		ids = append(ids, m.ID)
	}
	if strings.Join(ids, " ") != chatml.Name+" reviewer writer" {
		t.Errorf("/v1/models lists %v", ids)
	}
	// A return to an evacuated persona says what it waits for.
	var evacuated string
	for _, p := range status().Personas {
		if p.State == persona.Evacuated {
			evacuated = p.Name
		}
	}
	code, body := socketPost(t, cfg.Daemon.Socket, "/v1/ask", `{"session":"p","query":"Hello?","persona":"`+evacuated+`"}`)
	if code != 200 || !strings.Contains(string(body), `{"type":"progress","text":"restoring persona \"`+evacuated+`\" from disk"}`) {
		t.Errorf("an ask of the evacuated persona %q: %d %s, want a progress event saying it is restored", evacuated, code, body)
	}
	// At the OpenAI door an evacuated persona is restored once the stream
	// has begun: a streaming agent is answered as by a resident one.
	for _, p := range status().Personas {
		if p.State == persona.Evacuated {
			evacuated = p.Name
		}
	}
	code, body = socketPost(t, cfg.Daemon.Socket, "/v1/chat/completions", `{"model":"`+evacuated+`","stream":true,"messages":[{"role":"user","content":"Hello?"}],"max_tokens":4}`)
	if code != 200 || !strings.Contains(string(body), "data: [DONE]") || !strings.Contains(string(body), `"model":"`+evacuated+`"`) {
		t.Errorf("a streamed chat with the evacuated persona %q: %d %s", evacuated, code, body)
	}
	if s := status(); slices.IndexFunc(s.Personas, func(p httpapi.PersonaStatus) bool { return p.Name == evacuated && p.State == persona.Resident }) < 0 {
		t.Errorf("persona %q was not restored by the door's ask: %+v", evacuated, s.Personas)
	}
	// Ollama's door lists every persona, and as running only those loaded.
	for path, want := range map[string]int{"/api/tags": 3, "/api/ps": 2} {
		var list struct {
			Models []struct {
				Name string `json:"name"`
			} `json:"models"`
		}
		if err := d.client.GetJSON(ctx, path, &list); err != nil || len(list.Models) != want {
			t.Errorf("%s lists %+v (%v), want %d models", path, list.Models, err, want)
		}
	}

	code, body = socketPost(t, cfg.Daemon.Socket, "/v1/chat/completions", `{"model":"writer","messages":[{"role":"user","content":"Hello?"}],"max_tokens":4}`)
	var resp struct {
		Model string        `json:"model"`
		Ctxd  *ctxd.Summary `json:"ctxd"`
	}
	if err := json.Unmarshal(body, &resp); code != 200 || err != nil || resp.Model != "writer" || resp.Ctxd == nil {
		t.Errorf("the OpenAI door, model writer: %d %s", code, body)
	}
	code, body = socketPost(t, cfg.Daemon.Socket, "/v1/chat/completions", `{"model":"nobody","messages":[{"role":"user","content":"Hello?"}]}`)
	if code != 404 || !strings.Contains(string(body), "writer") {
		t.Errorf("an unknown persona: %d %s, want a 404 that lists the personas", code, body)
	}
}

// socketPost posts a JSON body to the daemon's socket.
func socketPost(t *testing.T, socket, path, body string) (int, []byte) {
	t.Helper()
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", socket)
	}}}
	resp, err := hc.Post("http://ctxd"+path, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// plannedBytes is what a managed llama-server of cfg's backend on gguf
// plans to hold, as the daemon plans it.
func plannedBytes(t *testing.T, cfg config.Config, gguf string) int64 {
	t.Helper()
	cfg.Backend.GGUF = gguf
	probe := hostenv.New(hostenv.Config{})
	defer probe.Close()
	_, n, err := bringup.Config{Backend: cfg.Backend, Limits: cfg.Limits, Memory: probe}.Plan()
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestPersonasOnOllama: on Ollama every persona's model loads on the one
// managed server (OLLAMA_MAX_LOADED_MODELS counts them), and ctxd's budget
// decides which stay loaded: under a budget that holds one, asking the
// other persona unloads the first (Ollama's /api/ps no longer lists it),
// and asking the first again loads it back. Ollama cannot save a slot, so
// a return evaluates its prompt again.
func TestPersonasOnOllama(t *testing.T) {
	needOllama(t)
	chatml := templatedModels()[0]
	state := t.TempDir()
	cfg := baseConfig(t, state, codexDir(t, 3000))
	cfg.Personas = []config.Persona{{Name: "writer", GGUF: modelPath(t, chatml), Persona: "You write documentation."}}
	planA := plannedBytes(t, cfg, cfg.Backend.GGUF)
	planB := plannedBytes(t, cfg, cfg.Personas[0].GGUF)
	cfg.Limits.MemoryBudgetMB = int(max(planA, planB)*3/2>>20) + 1 // one at a time, with room for a plan raised to what its runner holds
	d := start(t, cfg, true)
	ctx := context.Background()
	var st httpapi.Status
	if err := d.client.GetJSON(ctx, "/v1/status", &st); err != nil {
		t.Fatal(err)
	}
	running := func() []string {
		t.Helper()
		resp, err := http.Get(st.Backend.URL + "/api/ps")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var ps struct {
			Models []struct {
				Name string `json:"name"`
			} `json:"models"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&ps); err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, m := range ps.Models {
			names = append(names, strings.TrimSuffix(m.Name, ":latest"))
		}
		return names
	}
	for i, step := range []struct {
		persona, loaded string
	}{{"", cfg.Backend.Model}, {"writer", "writer"}, {"", cfg.Backend.Model}, {"writer", "writer"}} {
		sum, err := d.client.Ask(ctx, ctxd.AskRequest{Session: "s-" + step.loaded, Query: "What does Handler3 return?", Persona: step.persona}, nil)
		if err != nil {
			t.Fatalf("step %d (%s): %v", i, step.loaded, err)
		}
		t.Logf("step %d: %s, %d prompt tokens, %d cached", i, step.loaded, sum.PromptTokens, sum.CachedTokens)
		if got := running(); len(got) != 1 || got[0] != step.loaded {
			t.Errorf("step %d: Ollama runs %v, want only %s", i, got, step.loaded)
		}
	}
	var after httpapi.Status
	if err := d.client.GetJSON(ctx, "/v1/status", &after); err != nil {
		t.Fatal(err)
	}
	for _, p := range after.Personas.Personas {
		t.Logf("persona %+v", p)
		if p.Evacuations < 1 {
			t.Errorf("persona %s was never evacuated", p.Name)
		}
		if p.State == persona.Resident && p.RSS <= 0 {
			t.Errorf("persona %s is resident, but no Ollama runner of its model was found", p.Name)
		}
	}
}
