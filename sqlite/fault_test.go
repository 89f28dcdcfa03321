package sqlite

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ctxd/ctxd"
)

// TestDiskFullIsNamedAndPasses: on a full disk (a small tmpfs, filled)
// a write fails saying the store's disk is full, and once space is freed
// the same store writes again. It needs root, to mount the tmpfs.
func TestDiskFullIsNamedAndPasses(t *testing.T) {
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", dir).CombinedOutput(); err != nil {
		t.Skipf("mounting a tmpfs needs root: %v: %s", err, out)
	}
	t.Cleanup(func() { exec.Command("umount", "-l", dir).Run() })
	ctx := context.Background()
	s, err := Open(ctx, filepath.Join(dir, "ctxd.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	turn := ctxd.Turn{Query: "q", Answer: strings.Repeat("a", 64<<10)}
	if _, err := s.AppendTurn(ctx, "s", turn, nil, time.Now()); err != nil {
		t.Fatal(err)
	}
	filler := filepath.Join(dir, "filler")
	f, err := os.Create(filler)
	if err != nil {
		t.Fatal(err)
	}
	for buf := make([]byte, 64<<10); ; {
		if _, err := f.Write(buf); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatal(err)
			}
			break
		}
	}
	f.Close()
	var werr error
	for i := 0; i < 50 && werr == nil; i++ { // the write-ahead log may hold a few turns first
		_, werr = s.AppendTurn(ctx, "s", turn, nil, time.Now())
	}
	if werr == nil || !strings.Contains(werr.Error(), "the session store "+filepath.Join(dir, "ctxd.db")+" could not be written: the disk holding it is full") {
		t.Fatalf("a write on a full disk: %v", werr)
	}
	t.Log(werr)
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	if _, err := s.AppendTurn(ctx, "s", turn, nil, time.Now()); err != nil {
		t.Fatalf("a write once space was freed: %v", err)
	}
}
