package bench

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// AgentRun is the many-agents phase on one slot count: every agent sends
// its turns back to back, all agents at once, over one codex.
type AgentRun struct {
	Slots        int          `json:"slots"`
	Agents       int          `json:"agents"`
	Turns        int          `json:"turns_per_agent"`
	WallMs       float64      `json:"wall_ms"`        // from the first question to the last answer
	PerAgent     []AgentStats `json:"per_agent"`      // one per agent
	All          AgentStats   `json:"all"`            // every request of every agent
	Concurrency  int          `json:"max_concurrent"` // most requests generating at once, as the scheduler reported
	StableTokens int          `json:"stable_tokens"`  // the shared stable blocks (codex included)
	AnswerTokens int          `json:"answer_tokens"`  // the answer reserve: the most tokens an answer has
	Model        string       `json:"model"`
}

// AgentStats summarizes requests: client-side time to first token (queue
// wait included), the queue wait itself, and the tokens evaluated.
type AgentStats struct {
	Agent     string    `json:"agent"`
	TTFTP50   float64   `json:"ttft_p50_ms"`
	TTFTP95   float64   `json:"ttft_p95_ms"`
	WaitP50   float64   `json:"queue_wait_p50_ms"`
	WaitP95   float64   `json:"queue_wait_p95_ms"`
	EvalP50   float64   `json:"evaluated_tokens_p50"`
	CachedP50 float64   `json:"cached_tokens_p50"`
	TTFTMs    []float64 `json:"ttft_ms"`
	WaitMs    []float64 `json:"queue_wait_ms"`
	Evaluated []float64 `json:"evaluated_tokens"`
	Cached    []float64 `json:"cached_tokens"`
}

func (a *AgentStats) summarize() {
	a.TTFTP50, a.TTFTP95 = percentile(a.TTFTMs, 0.5), percentile(a.TTFTMs, 0.95)
	a.WaitP50, a.WaitP95 = percentile(a.WaitMs, 0.5), percentile(a.WaitMs, 0.95)
	a.EvalP50, a.CachedP50 = percentile(a.Evaluated, 0.5), percentile(a.Cached, 0.5)
}

// agents runs the many-agents phase once per slot count.
func agents(ctx context.Context, cfg Config) ([]AgentRun, error) {
	var runs []AgentRun
	for _, slots := range cfg.AgentSlots {
		cfg.Log("agents: %d agents × %d turns on %d slot(s)", cfg.Agents, cfg.AgentTurns, slots)
		st, err := startStack(ctx, cfg, cfg.AgentModel, cfg.AgentModelPath, cfg.NumCtx, slots)
		if err != nil {
			return nil, err
		}
		run, err := agentRun(ctx, cfg, st, slots)
		st.stop()
		if err != nil {
			return nil, err
		}
		cfg.Log("  %d slot(s): TTFT p50 %.0f ms, p95 %.0f ms; queue wait p50 %.0f ms, p95 %.0f ms; %.0f s in all",
			slots, run.All.TTFTP50, run.All.TTFTP95, run.All.WaitP50, run.All.WaitP95, run.WallMs/1000)
		runs = append(runs, run)
	}
	return runs, nil
}

func agentRun(ctx context.Context, cfg Config, st *stack, slots int) (AgentRun, error) {
	m := cfg.AgentModel
	run := AgentRun{Slots: slots, Agents: cfg.Agents, Turns: cfg.AgentTurns, AnswerTokens: cfg.AnswerToks,
		Model: fmt.Sprintf("%s (%.1fM parameters), num_ctx %d", m.Name, float64(m.Params())/1e6, cfg.NumCtx)}
	run.PerAgent = make([]AgentStats, cfg.Agents)
	var wg sync.WaitGroup
	errs := make(chan error, cfg.Agents)
	start := time.Now()
	for i := range cfg.Agents {
		a := &run.PerAgent[i]
		a.Agent = fmt.Sprintf("agent-%d", i+1)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for turn := range cfg.AgentTurns {
				sum, ttft, err := ask(ctx, st.ctxd, a.Agent, question(100*i+turn))
				if err != nil {
					errs <- fmt.Errorf("%s turn %d: %w", a.Agent, turn+1, err)
					return
				}
				a.TTFTMs = append(a.TTFTMs, ms(ttft))
				a.WaitMs = append(a.WaitMs, sum.QueueWaitMs)
				a.Evaluated = append(a.Evaluated, float64(sum.EvaluatedTokens))
				a.Cached = append(a.Cached, float64(sum.CachedTokens))
				if run.StableTokens == 0 && i == 0 {
					run.StableTokens = sum.Codex.StableTokens
				}
			}
		}()
	}
	// Watch the scheduler while the agents run: how many generate at once.
	stopWatch := make(chan struct{})
	watched := make(chan int)
	go func() {
		most := 0
		for {
			select {
			case <-stopWatch:
				watched <- most
				return
			case <-time.After(20 * time.Millisecond):
			}
			var s struct {
				Scheduler *struct {
					Busy int `json:"busy"`
				} `json:"scheduler"`
			}
			if st.ctxd.GetJSON(ctx, "/v1/status", &s) == nil && s.Scheduler != nil {
				most = max(most, s.Scheduler.Busy)
			}
		}
	}()
	wg.Wait()
	close(stopWatch)
	run.Concurrency = <-watched
	run.WallMs = ms(time.Since(start))
	close(errs)
	if err := <-errs; err != nil {
		return run, err
	}
	for i := range run.PerAgent {
		a := &run.PerAgent[i]
		a.summarize()
		run.All.TTFTMs = append(run.All.TTFTMs, a.TTFTMs...)
		run.All.WaitMs = append(run.All.WaitMs, a.WaitMs...)
		run.All.Evaluated = append(run.All.Evaluated, a.Evaluated...)
		run.All.Cached = append(run.All.Cached, a.Cached...)
	}
	run.All.Agent = "all"
	run.All.summarize()
	return run, nil
}
