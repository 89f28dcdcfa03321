package httpapi

import (
	"context"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/engine"
	"github.com/ctxd/ctxd/runcontext"
)

// Personas is a Core that serves several personas: Persona makes the one a
// request names resident (telling progress what it waits for) and returns
// its request path and what to call when the request is done with it;
// PersonaNames lists those a sigil may use, the default first.
type Personas interface {
	Persona(ctx context.Context, name, sigil string, progress func(string)) (*engine.Engine, func(), error)
	PersonaNames(sigil string) []PersonaInfo
	// PersonaPeek checks that the persona exists and the sigil may use it
	// (the errors Persona would give) and returns its request path if it
	// was ever loaded (nil otherwise), and whether it is resident now,
	// without loading anything.
	PersonaPeek(name, sigil string) (*engine.Engine, bool, error)
}

// PersonaInfo is one persona as the doors list it: its request path when
// it was ever loaded (nil otherwise), and its planned window.
type PersonaInfo struct {
	Name     string
	NumCtx   int
	Engine   *engine.Engine
	Resident bool // its model is loaded now
}

// persona is the request path of the persona a request names, on a Core
// that serves several; on one that serves one, its engine, and "" or its
// model's name (or "ctxd") names it.
func (srv *Server) persona(ctx context.Context, name, sigil string, progress func(string)) (*engine.Engine, func(), error) {
	if p, ok := srv.core.(Personas); ok {
		return p.Persona(ctx, name, sigil, progress)
	}
	e, err := srv.core.Engine()
	if err != nil {
		return nil, nil, err
	}
	if name != "" && name != "ctxd" && name != e.Model.Info.Model {
		return nil, nil, ctxd.Errorf(ctxd.KindNotFound, "persona %q not found; this ctxd serves %s", name, e.Model.Info.Model)
	}
	return e, func() {}, nil
}

// personaNames are the personas sigil may use; nil on a Core that serves
// one.
func (srv *Server) personaNames(sigil string) []PersonaInfo {
	if p, ok := srv.core.(Personas); ok {
		return p.PersonaNames(sigil)
	}
	return nil
}

// lazyPersona is an evacuated persona's request path as a door's engine:
// the persona is restored when the ask runs, once the door has begun its
// stream (whose keep-alives then flow while it waits), not before.
type lazyPersona struct {
	srv     *Server
	name    string
	release func() // the restored persona's, once AskAs took it
}

func (l *lazyPersona) AskAs(ctx context.Context, sigil runcontext.Sigil, req ctxd.AskRequest, onToken func(string) error) (*ctxd.Summary, error) {
	e, release, err := l.srv.persona(ctx, l.name, sigil.Name, nil)
	if err != nil {
		return nil, err
	}
	l.release = release
	return e.Orch.AskAs(ctx, sigil, req, onToken)
}

// done lets the persona go, if AskAs took it.
func (l *lazyPersona) done() {
	if l.release != nil {
		l.release()
	}
}
