// Package systemd writes ctxd's systemd units: a user service and a socket
// unit for socket activation, with the absolute paths of the ctxd binary
// and its config file filled in (`ctxd systemd-units`).
//
// The daemon itself speaks systemd through main: it takes the activated
// socket when there is one (LISTEN_FDS) and signals READY=1 only once the
// backend answers.
package systemd
