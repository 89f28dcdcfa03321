package httpapi

import (
	"fmt"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/ctxd/ctxd/config"
)

// TestSlowBodiesDoNotStopTheDaemon: connections that send a request's
// headers and then stop sending its body are cut off after
// daemon.body_timeout, and past daemon.max_connections new connections
// wait rather than exhausting descriptors; while more slow connections
// than the cap are open, health still answers once the daemon has cut
// them, and an ask still succeeds.
func TestSlowBodiesDoNotStopTheDaemon(t *testing.T) {
	t.Parallel()
	f := newFixture(t, fixtureOptions{config: func(c *config.Config) {
		c.Daemon.MaxConnections = 16
		c.Daemon.BodyTimeout = config.Duration{Duration: 300 * time.Millisecond}
	}})
	const slow = 40
	var wg sync.WaitGroup
	cut := make(chan time.Duration, slow)
	for i := range slow {
		wg.Add(1)
		go func() {
			defer wg.Done()
			conn, err := net.Dial("unix", f.cfg.Daemon.Socket)
			if err != nil {
				t.Errorf("slow connection %d: %v", i, err)
				return
			}
			defer conn.Close()
			start := time.Now()
			fmt.Fprintf(conn, "POST /v1/ask HTTP/1.1\r\nHost: ctxd\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"session\":")
			_ = conn.SetReadDeadline(time.Now().Add(30 * time.Second)) // the test's guard, not the daemon's
			if _, err := io.ReadAll(conn); err != nil {
				if ne, ok := err.(net.Error); ok && ne.Timeout() {
					t.Errorf("slow connection %d: the daemon never cut it off", i)
					return
				}
			}
			cut <- time.Since(start)
		}()
	}
	if err := f.client.Health(t.Context()); err != nil {
		t.Fatalf("health during the flood: %v", err)
	}
	f.ask(t, "during-flood", "still there?")
	wg.Wait()
	close(cut)
	if n := len(cut); n != slow {
		t.Errorf("%d of %d slow connections were cut off", n, slow)
	}
}
