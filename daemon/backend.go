package daemon

import (
	"context"

	"github.com/ctxd/ctxd/ollama"
	"github.com/ctxd/ctxd/orchestrator"
)

// ollamaBackend adapts the Ollama client to the orchestrator's Backend.
type ollamaBackend struct {
	client      *ollama.Client
	temperature float64
	seed        int
}

var _ orchestrator.Backend = (*ollamaBackend)(nil)

func (b *ollamaBackend) Generate(ctx context.Context, req orchestrator.GenerateRequest, onToken func(string) error) (orchestrator.Generation, error) {
	res, err := b.client.Generate(ctx, req.Prompt, ollama.Sampling{
		MaxTokens: req.MaxTokens, Temperature: b.temperature, Seed: b.seed,
		NumKeep: req.NumKeep, Stop: req.Stop,
	}, onToken)
	done := res.DoneReason
	if done == ollama.DoneIncomplete {
		done = orchestrator.DoneIncomplete
	}
	return orchestrator.Generation{
		Text: res.Text, DoneReason: done, TTFT: res.TTFT,
		PromptEvalCount: res.Metrics.PromptEvalCount, PromptEvalDuration: res.Metrics.PromptEvalDuration,
		EvalCount: res.Metrics.EvalCount, EvalDuration: res.Metrics.EvalDuration,
	}, err
}
