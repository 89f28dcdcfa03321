package daemon

import (
	"github.com/ctxd/ctxd/frontdoor"
)

// doors are the OpenAI- and Ollama-compatible front doors on the
// daemon's request path.
func (d *Daemon) doors() *frontdoor.Doors {
	return frontdoor.New(frontdoor.Config{
		Engine: func() (frontdoor.Engine, frontdoor.Model, error) {
			e, err := d.engine()
			if err != nil {
				return nil, frontdoor.Model{}, err
			}
			info, facts := e.model.Info, e.model.Facts
			return e.orch, frontdoor.Model{
				Name: info.Model, Architecture: info.Architecture, NumCtx: info.NumCtx, AnswerReserve: e.orch.Limits().AnswerReserve,
				BackendKind: info.Kind, BackendVersion: info.Version, Loaded: e.since,
				Embedding: facts.Embedding, BlockCount: facts.BlockCount, Info: e.model.ModelInfo,
			}, nil
		},
		Sigil:        d.doorSigil,
		MaxBodyBytes: d.cfg.Daemon.MaxBodyBytes,
		WriteTimeout: d.cfg.Daemon.WriteTimeout.Duration,
		Logger:       d.log,
	})
}
