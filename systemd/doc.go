// Package systemd writes ctxd's systemd units: a hardened user service
// and a socket unit for socket activation, with the absolute paths of the
// ctxd binary, its config file and its state directory (the one place the
// service may write) filled in (`ctxd systemd-units`, `make install`).
// Verify has systemd check them (systemd-analyze verify).
//
// It does not speak to systemd: main does, through go-systemd. It takes
// the activated socket when there is one (LISTEN_FDS), signals READY=1
// only once the backend answers, keeps STATUS= current, feeds the
// watchdog while the daemon answers its own status, and says STOPPING=1.
package systemd
