package client_test

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ctxd/ctxd/client"
	"github.com/ctxd/ctxd/internal/otheruid"
)

// TestImpostorHelper is the other user's process of
// TestClientRefusesAnImpostor: it serves a socket in the daemon's place
// and answers like a daemon.
func TestImpostorHelper(t *testing.T) {
	sock := os.Getenv("CTXD_IMPOSTOR_SOCKET")
	if sock == "" {
		t.Skip("the other user's half of TestClientRefusesAnImpostor")
	}
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(sock, 0o777); err != nil {
		t.Fatal(err)
	}
	fmt.Println("impostor ready")
	_ = http.Serve(ln, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"status":"ready"}`)
	}))
}

// TestClientRefusesAnImpostor: a socket served by another user's process
// (one that took the daemon's place) is refused before any request is
// sent, with an error that says who serves it; a uid the client was told
// to trust is accepted.
func TestClientRefusesAnImpostor(t *testing.T) {
	otheruid.Skip(t)
	sock := filepath.Join(otheruid.Dir(t), "ctxd.sock")
	otheruid.Start(t, "TestImpostorHelper", "impostor ready", "CTXD_IMPOSTOR_SOCKET="+sock)
	err := client.New(sock).Health(t.Context())
	if !errors.Is(err, client.ErrNotTheDaemon) || !strings.Contains(err.Error(), fmt.Sprintf("uid %d", otheruid.UID)) {
		t.Fatalf("a socket served by uid %d: %v", otheruid.UID, err)
	}
	if err := client.New(sock, client.WithDaemonUIDs(otheruid.UID)).Health(t.Context()); err != nil {
		t.Errorf("a trusted uid: %v", err)
	}
}
