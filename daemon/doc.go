// Package daemon is ctxd's wiring and lifecycle, and the only package that
// wires the others together. Run starts a daemon in this order: the codex
// settings are checked, the state directory locked, the session store and
// the hardware probe opened; the HTTP surface (package httpapi) serves the
// socket at once, answering "starting"; the backend is brought up in the
// background (package bringup), retried until it answers, and the request
// path built on it (package engine). A reload (SIGHUP, POST /v1/reload)
// puts a new configuration in force atomically or refuses it whole.
//
// It stops in the reverse order: it stops bringing the backend up, drains
// the HTTP surface (running requests have daemon.shutdown_grace, then are
// stopped), closes the request path (the codex service, then the backend
// and its tokenizer), and closes the store last, so nothing a request does
// finds it closed.
package daemon
