// Package client talks to a running ctxd over its Unix socket: the Go
// counterpart of the socket API, used by `ctxd ask` and the tests.
package client
