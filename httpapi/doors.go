package httpapi

import (
	"github.com/ctxd/ctxd/frontdoor"
)

// doors are the OpenAI- and Ollama-compatible front doors on the
// daemon's request path.
func (srv *Server) doors() *frontdoor.Doors {
	return frontdoor.New(frontdoor.Config{
		Engine: func() (frontdoor.Engine, frontdoor.Model, error) {
			e, err := srv.core.Engine()
			if err != nil {
				return nil, frontdoor.Model{}, err
			}
			info, facts := e.Model.Info, e.Model.Facts
			return e.Orch, frontdoor.Model{
				Name: info.Model, Architecture: info.Architecture, NumCtx: info.NumCtx, AnswerReserve: e.Orch.Limits().AnswerReserve,
				BackendKind: info.Kind, BackendVersion: info.Version, Loaded: e.Since,
				Embedding: facts.Embedding, BlockCount: facts.BlockCount, Info: e.Model.ModelInfo,
				ToolOpen: e.Orch.ToolSyntax().Open,
			}, nil
		},
		Sigil:        srv.doorSigil,
		MaxBodyBytes: srv.cfg.Daemon.MaxBodyBytes,
		WriteTimeout: srv.cfg.Daemon.WriteTimeout.Duration,
		Logger:       srv.log,
	})
}
