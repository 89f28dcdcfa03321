package llamacpp

import (
	"slices"
	"strings"
	"testing"
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
	c.CacheRAMMiB = 256
	if args := c.Args("/run/l.sock", 0); !slices.Contains(args, "256") || slices.Contains(args, "--port") {
		t.Errorf("socket args with a prompt cache: %q", args)
	}
}
