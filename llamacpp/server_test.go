package llamacpp

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ctxd/ctxd/internal/llamaservertest"
	"github.com/ctxd/ctxd/internal/ollamatest"
	"github.com/ctxd/ctxd/modelgen"
	"github.com/ctxd/ctxd/supervise"
)

// TestServeArgs: the managed server gets the window for every slot, one
// window per slot, the save path, and the prompt cache the plan counted.
func TestServeArgs(t *testing.T) {
	c := ServeConfig{Model: "/m.gguf", CtxPerSlot: 4096, Slots: 3, SlotSavePath: "/state/slots", Threads: 2}
	got := strings.Join(c.Args("127.0.0.1", 8080), " ")
	for _, want := range []string{"-m /m.gguf", "--port 8080", "-c 12288", "-np 3", "--slot-save-path /state/slots", "--cache-ram 0", "-t 2", "--no-webui"} {
		if !strings.Contains(got, want) {
			t.Errorf("args %q lack %q", got, want)
		}
	}
	if strings.Contains(got, "--swa-full") {
		t.Errorf("args %q keep a sliding window's cache whole for a model without one", got)
	}
	if strings.Contains(got, "--cache-reuse") {
		t.Errorf("args %q shift cached chunks though backend.cache_reuse is off", got)
	}
	c.CacheRAMMiB, c.SWAFull, c.CacheReuse = 256, true, 64
	if args := c.Args("/run/l.sock", 0); !slices.Contains(args, "256") || slices.Contains(args, "--port") || !slices.Contains(args, "--swa-full") ||
		!strings.Contains(strings.Join(args, " "), "--cache-reuse 64") {
		t.Errorf("socket args with a prompt cache, a sliding window kept whole and chunk reuse: %q", args)
	}
}

// TestManagedServerKeyAndSocket: a managed llama-server requires the key
// ctxd made for it, which its client sends and its command line does not
// show; on a Unix socket, a crashed server's socket file does not keep the
// restart from binding.
func TestManagedServerKeyAndSocket(t *testing.T) {
	bin := llamaservertest.Binary(t)
	model := ollamatest.Model(t, modelgen.DefaultConfig())
	sockDir, err := os.MkdirTemp("", "ctxd-llama-") // t.TempDir can exceed a socket path's 108 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(sockDir) })
	for _, addr := range []string{"127.0.0.1:0", filepath.Join(sockDir, "l.sock")} {
		t.Run(addr, func(t *testing.T) {
			dir := t.TempDir()
			restarted := make(chan struct{}, 1)
			srv, err := Start(t.Context(), ServeConfig{
				Binary: bin, Addr: addr, Model: model, CtxPerSlot: 512, Slots: 1,
				SlotSavePath: filepath.Join(dir, "slots"), LogPath: filepath.Join(dir, "log"),
				Env: []string{"PATH=" + os.Getenv("PATH")}, OnRestart: func() { restarted <- struct{}{} },
			}, Options{})
			if err != nil && strings.Contains(err.Error(), "exited during start") {
				t.Skipf("llama-server cannot start here: %v", err)
			} else if err != nil {
				t.Fatal(err)
			}
			defer srv.Process.Close()
			if _, err := srv.Client.Props(t.Context()); err != nil {
				t.Fatalf("the managed client: %v", err)
			}
			bare, err := New(srv.Client.Addr(), Options{})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := bare.Props(t.Context()); err == nil || !strings.Contains(err.Error(), "401") {
				t.Errorf("a client without the key: %v, want 401", err)
			}
			key := srv.Client.opts.APIKey
			cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", srv.PID()))
			if err != nil {
				t.Fatal(err)
			}
			if len(key) < 32 || strings.Contains(string(cmdline), key) {
				t.Errorf("key %d bytes long, on the command line: %v", len(key), strings.Contains(string(cmdline), key))
			}
			if err := syscall.Kill(srv.PID(), syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			select {
			case <-restarted:
			case <-time.After(60 * time.Second):
				t.Fatalf("not restarted within 60s; log:\n%s", supervise.Tail(filepath.Join(dir, "log"), 1024))
			}
			if _, err := srv.Client.Props(t.Context()); err != nil {
				t.Errorf("the managed client after the restart: %v", err)
			}
		})
	}
}
