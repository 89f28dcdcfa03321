//go:build linux

package sockowner

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// listenEnv makes the test binary a helper process that listens: its value
// is network and address, "tcp 127.0.0.1:0" or "unix /path.sock".
const listenEnv = "SOCKOWNER_TEST_LISTEN"

func TestMain(m *testing.M) {
	if spec := os.Getenv(listenEnv); spec != "" {
		os.Exit(listenHelper(spec))
	}
	os.Exit(m.Run())
}

// listenHelper listens, prints the address, and holds the listener (and
// the connections it accepts) until its stdin closes.
func listenHelper(spec string) int {
	network, addr, _ := strings.Cut(spec, " ")
	ln, err := net.Listen(network, addr)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close()
		}
	}()
	fmt.Println(ln.Addr())
	io.Copy(io.Discard, os.Stdin)
	return 0
}

// foreign starts a helper process in its own process group that listens
// at network/addr; it returns the address it listens on and its pid.
func foreign(t testing.TB, network, addr string) (string, int) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), listenEnv+"="+network+" "+addr)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		stdin.Close()
		cmd.Wait()
	})
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		t.Fatalf("helper: %v", err)
	}
	return strings.TrimSpace(line), cmd.Process.Pid
}

// self is the owner of this test process.
func self() Owner { return Owner{PGID: syscall.Getpgrp(), UID: os.Geteuid()} }

// own listens in this process and accepts (and keeps) connections when
// accept is true.
func own(t *testing.T, network, addr string, accept bool) string {
	t.Helper()
	ln, err := net.Listen(network, addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	if accept {
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				t.Cleanup(func() { c.Close() })
			}
		}()
	}
	return ln.Addr().String()
}

func sockPath(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "sockowner-") // t.TempDir can exceed a socket path's 108 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return filepath.Join(dir, "s.sock")
}

func TestCheckListener(t *testing.T) {
	type setup func(t *testing.T) (network, addr string, owner Owner)
	cases := []struct {
		name  string
		setup setup
		want  error  // nil, ErrNotOwned or ErrNotListening
		names string // in the error: the holder
	}{
		{"own tcp listener", func(t *testing.T) (string, string, Owner) {
			return "tcp", own(t, "tcp", "127.0.0.1:0", false), self()
		}, nil, ""},
		{"a child group's listener, checked for that group", func(t *testing.T) (string, string, Owner) {
			addr, pid := foreign(t, "tcp", "127.0.0.1:0")
			return "tcp", addr, Owner{PGID: pid, UID: os.Geteuid()}
		}, nil, ""},
		{"another process's listener", func(t *testing.T) (string, string, Owner) {
			addr, _ := foreign(t, "tcp", "127.0.0.1:0")
			return "tcp", addr, self()
		}, ErrNotOwned, "pid"},
		{"another process on the wildcard address of the port", func(t *testing.T) (string, string, Owner) {
			addr, _ := foreign(t, "tcp", "0.0.0.0:0")
			_, port, _ := net.SplitHostPort(addr)
			return "tcp", net.JoinHostPort("127.0.0.1", port), self()
		}, ErrNotOwned, "pid"},
		{"the right group, the wrong user", func(t *testing.T) (string, string, Owner) {
			return "tcp", own(t, "tcp", "127.0.0.1:0", false), Owner{PGID: syscall.Getpgrp(), UID: os.Geteuid() + 1}
		}, ErrNotOwned, fmt.Sprintf("uid %d", os.Geteuid())},
		{"nothing listens", func(t *testing.T) (string, string, Owner) {
			addr := own(t, "tcp", "127.0.0.1:0", false)
			return "tcp", addr[:strings.LastIndex(addr, ":")] + ":1", self()
		}, ErrNotListening, ""},
		{"own unix listener", func(t *testing.T) (string, string, Owner) {
			return "unix", own(t, "unix", sockPath(t), true), self()
		}, nil, ""},
		{"another process's unix listener", func(t *testing.T) (string, string, Owner) {
			addr, _ := foreign(t, "unix", sockPath(t))
			return "unix", addr, self()
		}, ErrNotOwned, "pid"},
		{"no unix listener", func(t *testing.T) (string, string, Owner) {
			return "unix", sockPath(t), self()
		}, ErrNotListening, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			network, addr, owner := c.setup(t)
			bothWays(t, func(t *testing.T) {
				checkErr(t, owner.CheckListener(network, addr), c.want, c.names)
			})
		})
	}
}

func TestCheckConn(t *testing.T) {
	cases := []struct {
		name            string
		network, listen string
		foreign         bool
		accept          bool
		want            error
	}{
		{"own tcp, accepted", "tcp", "127.0.0.1:0", false, true, nil},
		{"own tcp, in the accept queue", "tcp", "127.0.0.1:0", false, false, nil},
		{"own tcp6, accepted", "tcp", "[::1]:0", false, true, nil},
		{"another process's tcp", "tcp", "127.0.0.1:0", true, true, ErrNotOwned},
		{"own unix", "unix", "", false, true, nil},
		{"another process's unix", "unix", "", true, true, ErrNotOwned},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			listen := c.listen
			if c.network == "unix" {
				listen = sockPath(t)
			}
			if strings.HasPrefix(listen, "[::1]") {
				if ln, err := net.Listen("tcp", listen); err != nil {
					t.Skipf("no IPv6 loopback here: %v", err)
				} else {
					ln.Close()
				}
			}
			var addr string
			if c.foreign {
				addr, _ = foreign(t, c.network, listen)
			} else {
				addr = own(t, c.network, listen, c.accept)
			}
			conn, err := net.Dial(c.network, addr)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			bothWays(t, func(t *testing.T) {
				checkErr(t, self().CheckConn(conn), c.want, "")
			})
		})
	}
}

func checkErr(t *testing.T, err, want error, names string) {
	t.Helper()
	switch {
	case want == nil && err != nil:
		t.Fatalf("got %v, want nil", err)
	case want != nil && !errors.Is(err, want):
		t.Fatalf("got %v, want %v", err, want)
	case want != nil && !strings.Contains(err.Error(), names):
		t.Fatalf("error %q does not name %q", err, names)
	}
	if err != nil {
		t.Log(err)
	}
}

func TestParseTCP(t *testing.T) {
	text := `  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 4242 1 0000000000000000 100 0 0 10 0
   1: 0100007F:C350 0100007F:1F90 01 00000000:00000000 00:00000000 00000000 65534        0 0 1 0000000000000000 20 4 30 10 -1
`
	text6 := `  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000000000000000000001000000:1F91 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 77 1 0000000000000000 100 0 0 10 0
   1: 0000000000000000FFFF00000100007F:1F92 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 78 1 0000000000000000 100 0 0 10 0
`
	socks, err := parseTCP([]byte(text))
	if err != nil {
		t.Fatal(err)
	}
	socks6, err := parseTCP([]byte(text6))
	if err != nil {
		t.Fatal(err)
	}
	if !littleEndian() {
		t.Skip("the fixture is a little-endian machine's")
	}
	want := []socket{
		{local: netip.MustParseAddrPort("127.0.0.1:8080"), remote: netip.MustParseAddrPort("0.0.0.0:0"), state: stateListen, uid: 1000, inode: 4242},
		{local: netip.MustParseAddrPort("127.0.0.1:50000"), remote: netip.MustParseAddrPort("127.0.0.1:8080"), state: 1, uid: 65534},
		{local: netip.MustParseAddrPort("[::1]:8081"), remote: netip.MustParseAddrPort("[::]:0"), state: stateListen, inode: 77},
		{local: netip.MustParseAddrPort("[::ffff:127.0.0.1]:8082"), remote: netip.MustParseAddrPort("[::]:0"), state: stateListen, inode: 78},
	}
	got := append(socks, socks6...)
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("parsed\n%v\nwant\n%v", got, want)
	}
	if _, err := parseTCP([]byte("header\n 0: zz:1 00000000:0000 0A\n")); err == nil {
		t.Error("a short line parsed")
	}
}

func littleEndian() bool { return binary.NativeEndian.Uint16([]byte{1, 0}) == 1 }

func TestListeners(t *testing.T) {
	listen := func(addrs ...string) []socket {
		var out []socket
		for i, a := range addrs {
			out = append(out, socket{local: netip.MustParseAddrPort(a), state: stateListen, inode: uint64(i + 1)})
		}
		return out
	}
	conn := socket{local: netip.MustParseAddrPort("127.0.0.1:80"), remote: netip.MustParseAddrPort("127.0.0.1:5000"), state: 1, inode: 99}
	cases := []struct {
		name   string
		socks  []socket
		target string
		want   []uint64 // the inodes reached
	}{
		{"the address", listen("127.0.0.1:80"), "127.0.0.1:80", []uint64{1}},
		{"another port", listen("127.0.0.1:81"), "127.0.0.1:80", nil},
		{"another address", listen("127.0.0.2:80"), "127.0.0.1:80", nil},
		{"the IPv4 wildcard", listen("0.0.0.0:80"), "127.0.0.1:80", []uint64{1}},
		{"the IPv4 wildcard, an IPv6 target", listen("0.0.0.0:80"), "[::1]:80", nil},
		{"the IPv6 wildcard, dual stack", listen("[::]:80"), "127.0.0.1:80", []uint64{1}},
		{"the IPv6 wildcard", listen("[::]:80"), "[::1]:80", []uint64{1}},
		{"a mapped address", listen("[::ffff:127.0.0.1]:80"), "127.0.0.1:80", []uint64{1}},
		{"::1 for 127.0.0.1", listen("[::1]:80"), "127.0.0.1:80", nil},
		{"the address wins over wildcards", listen("0.0.0.0:80", "127.0.0.1:80", "[::]:80"), "127.0.0.1:80", []uint64{2}},
		{"both wildcards", listen("0.0.0.0:80", "[::]:80"), "127.0.0.1:80", []uint64{1, 2}},
		{"not a connection", append(listen("127.0.0.1:80"), conn), "127.0.0.1:80", []uint64{1}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var got []uint64
			for _, s := range listeners(c.socks, netip.MustParseAddrPort(c.target)) {
				got = append(got, s.inode)
			}
			if fmt.Sprint(got) != fmt.Sprint(c.want) {
				t.Errorf("reached %v, want %v", got, c.want)
			}
		})
	}
}

// bothWays runs a test with the kernel's socket diagnostics (netlink), and
// again with /proc/net/tcp, which the checks read where netlink is not
// allowed.
func bothWays(t *testing.T, test func(t *testing.T)) {
	t.Run("netlink", test)
	t.Run("proc", func(t *testing.T) {
		useNetlink = false
		defer func() { useNetlink = true }()
		test(t)
	})
}

// TestDiagAgreesWithProc: what netlink says of a listener and of the
// server end of a connection, accepted or still queued, is what
// /proc/net/tcp says.
func TestDiagAgreesWithProc(t *testing.T) {
	for _, listen := range []string{"127.0.0.1:0", "[::1]:0"} {
		t.Run(listen, func(t *testing.T) {
			ln, err := net.Listen("tcp", listen)
			if err != nil {
				t.Skipf("cannot listen on %s: %v", listen, err)
			}
			defer ln.Close()
			accepted, err := net.Dial("tcp", ln.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer accepted.Close()
			sc, err := ln.Accept()
			if err != nil {
				t.Fatal(err)
			}
			defer sc.Close()
			if sc.RemoteAddr().String() != accepted.LocalAddr().String() {
				t.Fatalf("accepted %v, dialed from %v", sc.RemoteAddr(), accepted.LocalAddr())
			}
			queued, err := net.Dial("tcp", ln.Addr().String()) // never accepted: its server end has no inode
			if err != nil {
				t.Fatal(err)
			}
			defer queued.Close()
			proc, err := readTCP(tcp4, tcp6)
			if err != nil {
				t.Fatal(err)
			}
			inProc := func(local, remote netip.AddrPort) socket {
				for _, s := range proc {
					if same(s.local, local) && (s.state == stateListen && !remote.IsValid() || s.state != stateListen && same(s.remote, remote)) {
						return s
					}
				}
				t.Fatalf("%v–%v is not in /proc/net/tcp", local, remote)
				return socket{}
			}
			server := ln.Addr().(*net.TCPAddr).AddrPort()
			for _, c := range []net.Conn{accepted, queued} {
				client := c.LocalAddr().(*net.TCPAddr).AddrPort()
				got, err := diagConn(server, client)
				if err != nil {
					t.Fatal(err)
				}
				want := inProc(server, client)
				if got.state != want.state || got.uid != want.uid || got.inode != want.inode || !same(got.local, server) || !same(got.remote, client) {
					t.Errorf("netlink %+v, /proc %+v", got, want)
				}
			}
			lns, err := diagListeners()
			if err != nil {
				t.Fatal(err)
			}
			want := inProc(server, netip.AddrPort{})
			if got := listeners(lns, server); len(got) != 1 || got[0].inode != want.inode || got[0].uid != want.uid {
				t.Errorf("netlink listeners on %v: %+v, /proc: %+v", server, got, want)
			}
		})
	}
}

// BenchmarkCheckConn: the check of an accepted connection's server end,
// held by another process group's leader (as a managed server's is),
// through netlink and through /proc.
func BenchmarkCheckConn(b *testing.B) {
	addr, pid := foreign(b, "tcp", "127.0.0.1:0")
	c, err := net.Dial("tcp", addr)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	owner := Owner{PGID: pid, UID: os.Geteuid()}
	for _, way := range []string{"netlink", "proc"} {
		b.Run(way, func(b *testing.B) {
			useNetlink = way == "netlink"
			defer func() { useNetlink = true }()
			for b.Loop() {
				if err := owner.CheckConn(c); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
