// Package systemd holds ctxd's systemd units: a user service and a socket
// unit for socket activation. `ctxd systemd-units DIR` writes them out.
//
// The daemon itself speaks systemd through main: it takes the activated
// socket when there is one (LISTEN_FDS) and signals READY=1 only once the
// backend answers.
package systemd

import "embed"

// Units are the unit files, by name.
//
//go:embed ctxd.service ctxd.socket
var Units embed.FS

// Names lists the unit files in Units.
var Names = []string{"ctxd.service", "ctxd.socket"}
