package sockowner

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// CheckListener checks that the sockets listening where a connection to
// addr arrives are held by o. network is "tcp" (addr a host:port with an
// IP address: the listeners on that address, or if there are none, those
// on the wildcard address of the port) or "unix" (addr a socket path,
// which it dials).
// The error wraps ErrNotOwned, naming the holder's uid and pid where /proc
// shows them, or ErrNotListening.
func (o Owner) CheckListener(network, addr string) error {
	switch network {
	case "tcp", "tcp4", "tcp6":
		target, err := netip.ParseAddrPort(addr)
		if err != nil {
			return fmt.Errorf("sockowner: %w", err)
		}
		socks, err := diagListeners()
		if err != nil {
			if socks, err = readTCP(tcp4, tcp6); err != nil {
				return err
			}
		}
		lns := listeners(socks, target)
		if len(lns) == 0 {
			return fmt.Errorf("sockowner: %s: %w", addr, ErrNotListening)
		}
		for _, s := range lns {
			if err := o.checkSocket(addr, s); err != nil {
				return err
			}
		}
		return nil
	case "unix":
		c, err := net.DialTimeout("unix", addr, 5*time.Second)
		if err != nil {
			if errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ENOENT) {
				return fmt.Errorf("sockowner: %s: %w (%v)", addr, ErrNotListening, err)
			}
			return fmt.Errorf("sockowner: %w", err)
		}
		defer c.Close()
		return o.CheckConn(c)
	}
	return fmt.Errorf("sockowner: network %q: not tcp or unix", network)
}

// CheckConn checks that the server end of c, a connection this process
// dialed to a local server, is held by o: for TCP, the server's socket of
// this very connection (its user, and the process that accepted it, or the
// listener that queued it); for a Unix socket, the peer credentials.
func (o Owner) CheckConn(c net.Conn) error {
	switch c := c.(type) {
	case *net.TCPConn:
		server, client := c.RemoteAddr().(*net.TCPAddr).AddrPort(), c.LocalAddr().(*net.TCPAddr).AddrPort()
		switch s, err := diagConn(server, client); {
		case err == nil && s.state != stateListen && s.inode != 0:
			return o.checkSocket(server.String(), s)
		case err == nil || errors.Is(err, errNotFound):
			// Not accepted yet (no inode), or not in the table: below.
			return o.CheckListener("tcp", server.String())
		}
		// No netlink here. Reading a table walks the kernel's whole hash
		// table (some milliseconds): the server end of an IPv4 connection
		// is in the IPv4 table unless the server listens on [::].
		tables := []string{tcp4, tcp6}
		if !server.Addr().Unmap().Is4() {
			tables = tables[1:]
		}
	tables:
		for _, table := range tables {
			socks, err := readTCP(table)
			if err != nil {
				return err
			}
			for _, s := range socks {
				if s.state == stateListen || !same(s.local, server) || !same(s.remote, client) {
					continue
				}
				if s.inode != 0 {
					return o.checkSocket(server.String(), s)
				}
				break tables
			}
		}
		// Not accepted yet (no inode), or (with SYN cookies) not yet in the
		// table: the connection is in the queue of the listener, whose
		// user it has.
		return o.CheckListener("tcp", server.String())
	case *net.UnixConn:
		cred, err := peerCred(c)
		if err != nil {
			return err
		}
		addr := c.RemoteAddr().String()
		if g, err := pgrp(cred.PID); cred.UID != o.UID || err != nil || g != o.PGID {
			return fmt.Errorf("sockowner: %s: %w: %s, not %v", addr, ErrNotOwned, holder(cred.UID, []int{cred.PID}), o)
		}
		return nil
	}
	return fmt.Errorf("sockowner: a %T is neither a TCP nor a Unix connection", c)
}

// checkSocket checks one socket of /proc/net/tcp: its user is o's, and a
// process of o's group holds it.
func (o Owner) checkSocket(addr string, s socket) error {
	if s.uid == o.UID && o.holds(s.inode) {
		return nil
	}
	return fmt.Errorf("sockowner: %s: %w: %s, not %v", addr, ErrNotOwned, holder(s.uid, holders(s.inode)), o)
}

// holds reports whether a process of o's group has the socket open.
func (o Owner) holds(inode uint64) bool {
	if inode == 0 {
		return false
	}
	link := "socket:[" + strconv.FormatUint(inode, 10) + "]"
	// The group's leader, the server itself, is the usual holder.
	if g, err := pgrp(o.PGID); err == nil && g == o.PGID && hasFD(o.PGID, link) {
		return true
	}
	for _, pid := range pids() {
		if g, err := pgrp(pid); err == nil && g == o.PGID && pid != o.PGID && hasFD(pid, link) {
			return true
		}
	}
	return false
}

// holders are the processes with the socket open that /proc shows: all of
// them to root, a user's own to the others.
func holders(inode uint64) []int {
	if inode == 0 {
		return nil
	}
	link := "socket:[" + strconv.FormatUint(inode, 10) + "]"
	var out []int
	for _, pid := range pids() {
		if hasFD(pid, link) {
			out = append(out, pid)
		}
	}
	slices.Sort(out)
	return out
}

func pids() []int {
	d, err := os.Open("/proc")
	if err != nil {
		return nil
	}
	defer d.Close()
	names, _ := d.Readdirnames(-1)
	var out []int
	for _, n := range names {
		if pid, err := strconv.Atoi(n); err == nil {
			out = append(out, pid)
		}
	}
	return out
}

// hasFD reports whether process pid has a file descriptor linked to link.
func hasFD(pid int, link string) bool {
	dir := "/proc/" + strconv.Itoa(pid) + "/fd"
	d, err := os.Open(dir)
	if err != nil {
		return false // gone, or another user's
	}
	defer d.Close()
	names, _ := d.Readdirnames(-1)
	for _, n := range names {
		if l, err := os.Readlink(dir + "/" + n); err == nil && l == link {
			return true
		}
	}
	return false
}

// pgrp is the process group of pid, from /proc/PID/stat.
func pgrp(pid int) (int, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	// pid (comm) state ppid pgrp ...; comm may hold spaces and parentheses.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, fmt.Errorf("sockowner: /proc/%d/stat: no command", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 3 {
		return 0, fmt.Errorf("sockowner: /proc/%d/stat: too short", pid)
	}
	return strconv.Atoi(f[2])
}

const stateListen = 0x0A // TCP_LISTEN in /proc/net/tcp's st column

// socket is one line of /proc/net/tcp or tcp6.
type socket struct {
	local, remote netip.AddrPort
	state         uint8
	uid           int
	inode         uint64 // 0 for a connection not accepted yet
}

// The TCP tables of this network namespace.
const (
	tcp4 = "/proc/net/tcp"
	tcp6 = "/proc/net/tcp6"
)

// readTCP reads TCP tables.
func readTCP(tables ...string) ([]socket, error) {
	var out []socket
	for _, path := range tables {
		b, err := os.ReadFile(path)
		if errors.Is(err, fs.ErrNotExist) && path == tcp6 {
			continue // no IPv6
		}
		if err != nil {
			return nil, fmt.Errorf("sockowner: %w", err)
		}
		socks, err := parseTCP(b)
		if err != nil {
			return nil, fmt.Errorf("sockowner: %s: %w", path, err)
		}
		out = append(out, socks...)
	}
	return out, nil
}

// parseTCP parses the text of /proc/net/tcp or tcp6.
func parseTCP(b []byte) ([]socket, error) {
	lines := strings.Split(string(b), "\n")
	var out []socket
	for _, line := range lines[1:] { // the first is the header
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		if len(f) < 10 {
			return nil, fmt.Errorf("short line %q", line)
		}
		var s socket
		var err error
		if s.local, err = parseAddrPort(f[1]); err != nil {
			return nil, err
		}
		if s.remote, err = parseAddrPort(f[2]); err != nil {
			return nil, err
		}
		st, err := strconv.ParseUint(f[3], 16, 8)
		if err != nil {
			return nil, fmt.Errorf("state %q: %w", f[3], err)
		}
		s.state = uint8(st)
		if s.uid, err = strconv.Atoi(f[7]); err != nil {
			return nil, fmt.Errorf("uid %q: %w", f[7], err)
		}
		if s.inode, err = strconv.ParseUint(f[9], 10, 64); err != nil {
			return nil, fmt.Errorf("inode %q: %w", f[9], err)
		}
		out = append(out, s)
	}
	return out, nil
}

// parseAddrPort parses "0100007F:1F90": the address as the kernel prints
// it, 32-bit words in host byte order, and the port.
func parseAddrPort(s string) (netip.AddrPort, error) {
	h, p, ok := strings.Cut(s, ":")
	raw, err := hex.DecodeString(h)
	if !ok || err != nil || (len(raw) != 4 && len(raw) != 16) {
		return netip.AddrPort{}, fmt.Errorf("address %q", s)
	}
	for i := 0; i < len(raw); i += 4 {
		binary.NativeEndian.PutUint32(raw[i:], binary.BigEndian.Uint32(raw[i:]))
	}
	port, err := strconv.ParseUint(p, 16, 16)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("port %q: %w", s, err)
	}
	addr, _ := netip.AddrFromSlice(raw)
	return netip.AddrPortFrom(addr, uint16(port)), nil
}

// listeners are the listening sockets a connection to target reaches: as
// Linux looks them up, those bound to its address if there are any, else
// those bound to the wildcard address of its family ([::] takes IPv4 too,
// unless IPV6_V6ONLY, which /proc does not show; it is counted).
func listeners(socks []socket, target netip.AddrPort) []socket {
	var exact, wild []socket
	t := target.Addr().Unmap()
	for _, s := range socks {
		if s.state != stateListen || s.local.Port() != target.Port() {
			continue
		}
		switch l := s.local.Addr().Unmap(); {
		case l == t:
			exact = append(exact, s)
		case l.IsUnspecified() && (l.Is6() || t.Is4()):
			wild = append(wild, s)
		}
	}
	if len(exact) > 0 {
		return exact
	}
	return wild
}

func same(a, b netip.AddrPort) bool {
	return a.Port() == b.Port() && a.Addr().Unmap() == b.Addr().Unmap()
}

// peerCred reads a Unix socket connection's peer credentials.
func peerCred(c *net.UnixConn) (Cred, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return Cred{}, fmt.Errorf("sockowner: %w", err)
	}
	var cred *syscall.Ucred
	var credErr error
	if err := raw.Control(func(fd uintptr) {
		cred, credErr = syscall.GetsockoptUcred(int(fd), syscall.SOL_SOCKET, syscall.SO_PEERCRED)
	}); err != nil {
		return Cred{}, fmt.Errorf("sockowner: %w", err)
	}
	if credErr != nil {
		return Cred{}, fmt.Errorf("sockowner: peer credentials: %w", credErr)
	}
	return Cred{PID: int(cred.Pid), UID: int(cred.Uid), GID: int(cred.Gid)}, nil
}

// Peer is the credentials of the process at the other end of a Unix
// socket connection (SO_PEERCRED: as the kernel recorded them when it
// connected, or listened); false for any other connection. A connection
// that wraps another (an Unwrap() net.Conn method) is unwrapped.
func Peer(c net.Conn) (Cred, bool) {
	for {
		w, ok := c.(interface{ Unwrap() net.Conn })
		if !ok {
			break
		}
		c = w.Unwrap()
	}
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return Cred{}, false
	}
	cred, err := peerCred(uc)
	return cred, err == nil
}
