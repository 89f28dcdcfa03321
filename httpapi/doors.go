package httpapi

import (
	"net/http"
	"time"

	"github.com/ctxd/ctxd/engine"
	"github.com/ctxd/ctxd/frontdoor"
)

// doors are the OpenAI- and Ollama-compatible front doors on the
// daemon's request path.
func (srv *Server) doors() *frontdoor.Doors {
	cfg := frontdoor.Config{
		Engine: func() (frontdoor.Engine, frontdoor.Model, error) {
			e, err := srv.core.Engine()
			if err != nil {
				return nil, frontdoor.Model{}, err
			}
			return e.Orch, doorModel(e), nil
		},
		Sigil:        srv.doorSigil,
		MaxBodyBytes: srv.cfg.Daemon.MaxBodyBytes,
		WriteTimeout: srv.cfg.Daemon.WriteTimeout.Duration,
		Logger:       srv.log,
	}
	if ps, ok := srv.core.(Personas); ok {
		cfg.Persona = func(r *http.Request, model string) (frontdoor.Engine, frontdoor.Model, func(), error) {
			sg, err := srv.doorSigil(r)
			if err != nil {
				return nil, frontdoor.Model{}, nil, err
			}
			// An evacuated persona is restored once the door's stream has
			// begun, so that a streaming client hears its keep-alives while
			// it waits; a cold one (its model unknown yet) loads now.
			e, resident, err := ps.PersonaPeek(model, sg.Name)
			if err != nil {
				return nil, frontdoor.Model{}, nil, err
			}
			if e != nil && !resident {
				lazy := &lazyPersona{srv: srv, name: model}
				return lazy, doorModel(e), lazy.done, nil
			}
			e, release, err := srv.persona(r.Context(), model, sg.Name, nil)
			if err != nil {
				return nil, frontdoor.Model{}, nil, err
			}
			return e.Orch, doorModel(e), release, nil
		}
		cfg.Models = func(r *http.Request) []frontdoor.Model {
			sg, err := srv.doorSigil(r)
			if err != nil {
				return nil
			}
			var since time.Time // a persona never loaded: listed as of the daemon's start
			if e, err := srv.core.Engine(); err == nil {
				since = e.Since
			}
			var out []frontdoor.Model
			for _, p := range srv.personaNames(sg.Name) {
				m := frontdoor.Model{Name: p.Name, NumCtx: p.NumCtx, Loaded: since}
				if p.Engine != nil {
					m = doorModel(p.Engine)
					m.Name = p.Name
				}
				m.Unloaded = !p.Resident
				out = append(out, m)
			}
			return out
		}
	}
	return frontdoor.New(cfg)
}

// doorModel is the model a request path serves, as the doors show it.
func doorModel(e *engine.Engine) frontdoor.Model {
	info, facts := e.Model.Info, e.Model.Facts
	return frontdoor.Model{
		Name: info.Model, Architecture: info.Architecture, NumCtx: info.NumCtx, AnswerReserve: e.Orch.Limits().AnswerReserve,
		BackendKind: info.Kind, BackendVersion: info.Version, Loaded: e.Since,
		Embedding: facts.Embedding, BlockCount: facts.BlockCount, Info: e.Model.ModelInfo,
		ToolOpen: e.Orch.ToolSyntax().Open,
	}
}
