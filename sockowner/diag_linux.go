package sockowner

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"syscall"
)

// The kernel's socket diagnostics (NETLINK_SOCK_DIAG, what ss uses) tell
// what a line of /proc/net/tcp tells of a socket, its state, user and
// inode, without printing the whole table: an exact lookup by a
// connection's addresses is a hash lookup, and a dump of listeners only
// walks the listening sockets. /proc/net/tcp walks every bucket of the
// connection table (milliseconds on a machine with much memory, however
// few sockets it holds). Where netlink is not allowed (some sandboxes),
// the checks read /proc instead.

// Constants of linux/netlink.h, linux/sock_diag.h and linux/inet_diag.h.
const (
	netlinkSockDiag   = 4  // NETLINK_SOCK_DIAG
	sockDiagByFamily  = 20 // SOCK_DIAG_BY_FAMILY
	nlmsgHdrLen       = 16 // struct nlmsghdr
	inetDiagReqLen    = 56 // struct inet_diag_req_v2
	inetDiagMsgLen    = 72 // struct inet_diag_msg
	inetDiagNoCookie  = ^uint32(0)
	tcpfListen        = 1 << stateListen
	tcpfAll           = ^uint32(0)
	diagAnswerMaxSize = 32 << 10
)

// useNetlink: ask the kernel's socket diagnostics; tests turn it off to
// check the /proc path too.
var useNetlink = true

// errNoNetlink: the checks read /proc instead.
var errNoNetlink = errors.New("sockowner: netlink: off")

// errNotFound: the kernel has no socket with those addresses.
var errNotFound = errors.New("no such socket")

// diagTCP sends one inet_diag request for TCP sockets of family (AF_INET
// or AF_INET6) in states (a TCPF_* mask): with dump false, the socket
// whose local end is local and remote end remote; with dump true, all
// of them (local and remote unused). An exact lookup that finds none
// fails with errNotFound.
func diagTCP(family uint8, states uint32, local, remote netip.AddrPort, dump bool) ([]socket, error) {
	if !useNetlink {
		return nil, errNoNetlink
	}
	fd, err := syscall.Socket(syscall.AF_NETLINK, syscall.SOCK_DGRAM|syscall.SOCK_CLOEXEC, netlinkSockDiag)
	if err != nil {
		return nil, fmt.Errorf("sockowner: netlink: %w", err)
	}
	defer syscall.Close(fd)
	req := make([]byte, nlmsgHdrLen+inetDiagReqLen)
	ne := binary.NativeEndian
	ne.PutUint32(req[0:], uint32(len(req)))
	ne.PutUint16(req[4:], sockDiagByFamily)
	flags := uint16(syscall.NLM_F_REQUEST)
	if dump {
		flags |= syscall.NLM_F_DUMP
	}
	ne.PutUint16(req[6:], flags)
	ne.PutUint32(req[8:], 1) // sequence
	r := req[nlmsgHdrLen:]
	r[0], r[1] = family, syscall.IPPROTO_TCP
	ne.PutUint32(r[4:], states)
	id := r[8:] // struct inet_diag_sockid: ports and addresses in network order
	if !dump {
		binary.BigEndian.PutUint16(id[0:], local.Port())
		binary.BigEndian.PutUint16(id[2:], remote.Port())
		putAddr(id[4:20], local.Addr(), family)
		putAddr(id[20:36], remote.Addr(), family)
	}
	ne.PutUint32(id[40:], inetDiagNoCookie)
	ne.PutUint32(id[44:], inetDiagNoCookie)
	if err := syscall.Sendto(fd, req, 0, &syscall.SockaddrNetlink{Family: syscall.AF_NETLINK}); err != nil {
		return nil, fmt.Errorf("sockowner: netlink: %w", err)
	}
	var out []socket
	buf := make([]byte, diagAnswerMaxSize)
	for {
		// The kernel answers within the send; a dump goes on in the
		// receives, so nothing here waits for another process.
		n, _, err := syscall.Recvfrom(fd, buf, 0)
		if err != nil {
			return nil, fmt.Errorf("sockowner: netlink: %w", err)
		}
		msgs, err := syscall.ParseNetlinkMessage(buf[:n])
		if err != nil {
			return nil, fmt.Errorf("sockowner: netlink: %w", err)
		}
		for _, m := range msgs {
			switch m.Header.Type {
			case syscall.NLMSG_DONE:
				return out, nil
			case syscall.NLMSG_ERROR:
				if len(m.Data) < 4 {
					return nil, errors.New("sockowner: netlink: short error")
				}
				switch errno := syscall.Errno(-int32(ne.Uint32(m.Data))); errno {
				case 0:
					continue
				case syscall.ENOENT:
					return nil, errNotFound
				default:
					return nil, fmt.Errorf("sockowner: netlink: %w", errno)
				}
			case sockDiagByFamily:
				s, err := parseDiag(m.Data)
				if err != nil {
					return nil, err
				}
				out = append(out, s)
			}
		}
		if !dump && len(out) > 0 {
			return out, nil
		}
	}
}

// putAddr writes an address as inet_diag_sockid holds it: 4 bytes, or 16.
func putAddr(b []byte, a netip.Addr, family uint8) {
	if family == syscall.AF_INET {
		v4 := a.Unmap().As4()
		copy(b, v4[:])
		return
	}
	v6 := a.As16() // an IPv4 address as the IPv4-mapped one
	copy(b, v6[:])
}

// parseDiag reads a struct inet_diag_msg.
func parseDiag(b []byte) (socket, error) {
	if len(b) < inetDiagMsgLen {
		return socket{}, fmt.Errorf("sockowner: netlink: a %d-byte answer", len(b))
	}
	addr := func(raw []byte) netip.Addr {
		if b[0] == syscall.AF_INET {
			return netip.AddrFrom4([4]byte(raw[:4]))
		}
		return netip.AddrFrom16([16]byte(raw[:16]))
	}
	id := b[4:52]
	ne := binary.NativeEndian
	return socket{
		local:  netip.AddrPortFrom(addr(id[4:20]), binary.BigEndian.Uint16(id[0:])),
		remote: netip.AddrPortFrom(addr(id[20:36]), binary.BigEndian.Uint16(id[2:])),
		state:  b[1],
		uid:    int(ne.Uint32(b[64:])),
		inode:  uint64(ne.Uint32(b[68:])),
	}, nil
}

// diagListeners are the listening TCP sockets, IPv4 and IPv6.
func diagListeners() ([]socket, error) {
	var out []socket
	for _, family := range []uint8{syscall.AF_INET, syscall.AF_INET6} {
		socks, err := diagTCP(family, tcpfListen, netip.AddrPort{}, netip.AddrPort{}, true)
		if err != nil {
			return nil, err
		}
		out = append(out, socks...)
	}
	return out, nil
}

// diagConn is the server end of a TCP connection this process dialed: the
// socket whose local end is server and remote end client. The server end
// of an IPv4 connection is an IPv4 socket unless the server listens on
// [::]: then an IPv6 one, with IPv4-mapped addresses.
func diagConn(server, client netip.AddrPort) (socket, error) {
	families := []uint8{syscall.AF_INET, syscall.AF_INET6}
	if !server.Addr().Unmap().Is4() {
		families = families[1:]
	}
	// Where the kernel finds no connection with these addresses, its
	// lookup answers with the listener a new one would reach.
	found := socket{}
	for _, family := range families {
		socks, err := diagTCP(family, tcpfAll, server, client, false)
		if errors.Is(err, errNotFound) {
			continue
		}
		if err != nil {
			return socket{}, err
		}
		if socks[0].state != stateListen {
			return socks[0], nil
		}
		found = socks[0]
	}
	if found.state == stateListen {
		return found, nil
	}
	return socket{}, errNotFound
}
