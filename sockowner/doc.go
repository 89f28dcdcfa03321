// Package sockowner tells whether a local server socket belongs to a given
// process: a process group (a supervised server and whatever it started)
// running as a given user. ctxd uses it so that it talks only to the model
// server it started, not to another local user's process that bound the
// same loopback port after the server crashed (or before it started).
//
// On Linux it asks the kernel's socket diagnostics (NETLINK_SOCK_DIAG, as
// ss does) for the listening socket's (or a connection's server end's)
// inode and user, or reads them from /proc/net/tcp and tcp6 where netlink
// is not allowed; it finds the processes holding the socket in
// /proc/PID/fd, their process group in /proc/PID/stat; for a Unix socket,
// it reads the peer credentials of a connection (SO_PEERCRED). Root sees
// every process there, so an impostor's pid is named when ctxd runs as
// root; its user is named always. A check of a connection through netlink
// takes tens of microseconds; reading /proc/net/tcp walks the kernel's
// whole connection table, some milliseconds. Either way a check is meant
// for each new connection, not each request.
//
// Elsewhere every check fails with errors.ErrUnsupported: there is no
// portable way to ask who holds a socket.
//
// It authenticates nothing: a process of the same user is not told apart
// from the owner's by its user, only by its process group, and such a
// process can read ctxd's memory anyway. It does not dial, except to check
// a Unix socket's listener.
package sockowner
