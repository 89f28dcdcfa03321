package integration

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/client"
	"github.com/ctxd/ctxd/config"
	"github.com/ctxd/ctxd/internal/pgtest"
)

// sharedDaemons starts n daemons on one PostgreSQL database, in front of
// one llama-server through the OpenAI backend (the cluster engine every
// node shares), each with its own state directory and socket.
func sharedDaemons(t *testing.T, pgURL string, n int) []*running {
	t.Helper()
	codex := codexDir(t, 1500)
	base := openaiConfig(t, t.TempDir(), codex)
	base.Backend.Slots = 4
	startOpenAIServer(t, &base)
	var out []*running
	for range n {
		cfg := openaiConfig(t, t.TempDir(), codex)
		cfg.Backend.URL, cfg.Backend.Slots = base.Backend.URL, base.Backend.Slots
		cfg.Store = config.Store{Kind: "postgres", URL: pgURL}
		out = append(out, start(t, cfg, true))
	}
	return out
}

// TestTwoDaemonsShareAPostgreSQLStore runs two daemons on one PostgreSQL
// (Debian's, started by the harness as an unprivileged user): a session
// begun on one goes on at the other and back, with every turn; a trace
// recorded at one and verified at the other enters the first's next karma
// epoch; and 32 agents whose turns alternate between the daemons leave
// every session with each of its turns once, in order.
func TestTwoDaemonsShareAPostgreSQLStore(t *testing.T) {
	needLlamaServer(t)
	pg := pgtest.Server(t)
	ds := sharedDaemons(t, pg.NewDatabase(t), 2)
	a, b := ds[0].client, ds[1].client

	// A session handed from one daemon to the other, and back.
	for i, c := range []*client.Client{a, a, b, a} {
		sum, _ := ask(t, c, "handoff", fmt.Sprintf("Question %d: what does Handler%d return?", i+1, i+1))
		if sum.Turn != i+1 {
			t.Fatalf("turn %d on daemon %d: the summary says turn %d (the other daemon's turns were not picked up)", i+1, slices.Index([]*client.Client{a, b}, c), sum.Turn)
		}
	}
	for _, c := range []*client.Client{a, b} {
		st, err := c.Session(context.Background(), "handoff")
		if err != nil || len(st.Turns) != 4 {
			t.Fatalf("the handed-off session as a daemon reads it: %+v %v, want 4 turns", st, err)
		}
	}

	// Karma across daemons: recorded at a, verified at b, shown at a.
	sum, _ := ask(t, a, "karma-1", "Which handler serves kind 3?")
	if sum.Trace == 0 {
		t.Fatal("the answer was not recorded as a trace")
	}
	if _, err := b.Judge(context.Background(), sum.Trace, ctxd.KarmaVerify, ctxd.KarmaJudgement{Note: "checked"}); err != nil {
		t.Fatalf("verify at the other daemon: %v", err)
	}
	next, _ := ask(t, a, "karma-2", "Which handler serves kind 4?")
	if next.Karma == nil || !slices.Contains(next.Karma.Traces, sum.Trace) {
		t.Fatalf("a new session at the first daemon shows karma %+v, want trace %d verified at the other", next.Karma, sum.Trace)
	}

	// One session asked at both daemons at the same moment: both begin
	// its karma epoch 1, the store keeps the first, and both answers are
	// recorded, as two turns.
	var both sync.WaitGroup
	for i, c := range []*client.Client{a, b} {
		both.Go(func() {
			if _, err := c.Ask(context.Background(), ctxd.AskRequest{Session: "both", Query: fmt.Sprintf("At once %d: what does Handler1 return?", i)}, nil); err != nil {
				t.Errorf("the same session at both daemons at once: %v", err)
			}
		})
	}
	both.Wait()
	if st, err := a.Session(context.Background(), "both"); err != nil || len(st.Turns) != 2 {
		t.Errorf("the session asked at both daemons at once: %+v %v, want 2 turns", st, err)
	}

	// 32 agents, each turn on the other daemon than the last.
	const agents, turns = 32, 3
	var wg sync.WaitGroup
	errs := make(chan error, agents*turns)
	for i := range agents {
		wg.Go(func() {
			for j := range turns {
				c := ds[(i+j)%2].client
				if _, err := c.Ask(context.Background(), ctxd.AskRequest{Session: "agent-" + strconv.Itoa(i), Query: fmt.Sprintf("Agent %d, turn %d: what does Handler%d return?", i, j+1, j)}, nil); err != nil {
					errs <- fmt.Errorf("agent %d turn %d: %w", i, j+1, err)
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	for i := range agents {
		st, err := b.Session(context.Background(), "agent-"+strconv.Itoa(i))
		if err != nil {
			t.Fatal(err)
		}
		if len(st.Turns) != turns {
			t.Errorf("agent %d: %d turns stored, want %d", i, len(st.Turns), turns)
			continue
		}
		for j, tr := range st.Turns {
			if want := fmt.Sprintf("Agent %d, turn %d:", i, j+1); len(tr.Query) < len(want) || tr.Query[:len(want)] != want {
				t.Errorf("agent %d: turn %d is %q, want it to begin %q", i, j+1, tr.Query, want)
			}
		}
	}
}

// TestPostgreSQLRestartLosesNoAcknowledgedTurn: 16 agents ask two
// daemons on one PostgreSQL while the server is restarted twice, once
// cleanly and once as a crash (immediate: recovered from its write-ahead
// log). Every answer a client received was recorded, and is there after;
// requests that met the outage failed with an error naming the store;
// the daemons went on without a restart.
func TestPostgreSQLRestartLosesNoAcknowledgedTurn(t *testing.T) {
	needLlamaServer(t)
	pg := pgtest.New(t)
	ds := sharedDaemons(t, pg.NewDatabase(t), 2)
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	var acked sync.Map // session → turns acknowledged, in order
	var okN, failN atomic.Int64
	var failures sync.Map // error text → count
	var wg sync.WaitGroup
	for i := range 16 {
		wg.Go(func() {
			session := "crash-" + strconv.Itoa(i)
			var mine []string
			for j := 0; ctx.Err() == nil; j++ {
				q := fmt.Sprintf("Agent %d, question %d: what does Handler%d return?", i, j, j%9)
				_, err := ds[j%2].client.Ask(ctx, ctxd.AskRequest{Session: session, Query: q}, nil)
				switch {
				case err == nil:
					mine = append(mine, q)
					acked.Store(session, slices.Clone(mine))
					okN.Add(1)
				case ctx.Err() != nil:
				default:
					failN.Add(1)
					key := sessionName.ReplaceAllString(err.Error(), `"crash-N"`)
					var n int
					if v, ok := failures.Load(key); ok {
						n = v.(int)
					}
					failures.Store(key, n+1)
					time.Sleep(50 * time.Millisecond)
				}
			}
		})
	}
	time.Sleep(3 * time.Second)
	before := okN.Load()
	pg.Restart(t) // fast: a clean stop
	time.Sleep(3 * time.Second)
	pg.Stop(t, pgtest.Immediate) // a crash
	time.Sleep(time.Second)      // requests meet the outage
	pg.Start(t)
	time.Sleep(3 * time.Second)
	after := okN.Load()
	stop()
	wg.Wait()
	if before == 0 || after == before {
		t.Fatalf("%d answers before the restarts, %d after: the agents did not run through them", before, after)
	}
	lost := 0
	total := 0
	acked.Range(func(k, v any) bool {
		session, want := k.(string), v.([]string)
		total += len(want)
		st, err := ds[0].client.Session(context.Background(), session)
		if err != nil {
			t.Fatalf("read %s after the restarts: %v", session, err)
		}
		var got []string
		for _, tr := range st.Turns {
			got = append(got, tr.Query)
		}
		for _, q := range want {
			if !slices.Contains(got, q) {
				lost++
				t.Errorf("%s: the acknowledged turn %q is gone", session, q)
			}
		}
		return true
	})
	failures.Range(func(k, v any) bool {
		t.Logf("%d× %s", v.(int), k)
		if !containsAny(k.(string), "store", "postgres", "PostgreSQL") {
			t.Errorf("a failure during the outage does not name the store: %s", k)
		}
		return true
	})
	t.Logf("PostgreSQL restarted (fast) and crashed (immediate) under 16 agents on two daemons: %d answers acknowledged, %d lost; %d requests failed during the outages", total, lost, failN.Load())
	if errors.Is(ctx.Err(), context.Canceled) && failN.Load() == 0 {
		t.Log("no request met an outage (they fell between requests)")
	}
}

// sessionName finds a crash test's session names, so that one failure
// met by many agents is counted as one.
var sessionName = regexp.MustCompile(`"crash-\d+"`)

func containsAny(s string, subs ...string) bool {
	for _, sub := range subs {
		if len(sub) > 0 && strings.Contains(s, sub) {
			return true
		}
	}
	return false
}
