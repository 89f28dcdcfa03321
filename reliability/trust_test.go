package reliability

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/client"
	"github.com/ctxd/ctxd/hostenv"
	"github.com/ctxd/ctxd/httpapi"
	"github.com/ctxd/ctxd/internal/otheruid"
	"github.com/ctxd/ctxd/sigils"
)

// The second trust round's targets (issue 27), measured on the real
// daemon: what a flood of unauthenticated connections, one sigil's
// thousand WebSockets, and floods of MCP sessions and karma notes cost
// the others. Each phase runs an agent that asks over the TCP listener
// with its token (a connection of its own per question) and a probe of
// TCP health every 100 ms (likewise), side by side with the quiet phase
// before.

// floodEnv names the TCP address the flood helper connects to; floodN
// how many connections it holds.
const (
	floodEnv  = "CTXD_REL_FLOOD_ADDR"
	floodNEnv = "CTXD_REL_FLOOD_N"
)

// TestUnauthFloodHelper is the flood, run as another user by
// TestTrustBoundaries: connections that send a request's headers and one
// byte of its body without a token, each opened again when the daemon
// closes it, until the helper is killed.
func TestUnauthFloodHelper(t *testing.T) {
	addr := os.Getenv(floodEnv)
	if addr == "" {
		t.Skip("the flood of TestTrustBoundaries, run as another user by it")
	}
	n, _ := strconv.Atoi(os.Getenv(floodNEnv))
	var opened atomic.Int64
	for range n {
		go func() {
			for {
				conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
				if err != nil {
					time.Sleep(100 * time.Millisecond)
					continue
				}
				opened.Add(1)
				fmt.Fprint(conn, "POST /v1/ask HTTP/1.1\r\nHost: ctxd\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n{")
				_, _ = bufio.NewReader(conn).ReadByte() // until the daemon answers or closes it
				conn.Close()
				time.Sleep(time.Second) // a slow client, not a busy loop
			}
		}()
	}
	for opened.Load() < int64(n) {
		time.Sleep(50 * time.Millisecond)
	}
	fmt.Println("flooding")
	select {}
}

// trustPhase is what the agent and the probe saw in one phase.
type trustPhase struct {
	name              string
	health, ttft      []float64 // ms
	healthErr, askErr map[string]int
	peakRSS           int64   // kB, the daemon's, sampled every 100 ms
	daemonCPU         float64 // the daemon's CPU time in the phase, as a share of one core
	floodCPU          float64 // the flood helper's, likewise (another uid's process; 0 when none)
}

// cpuSeconds is a process's user and system CPU time so far, in
// seconds; 0 if it cannot be read.
func cpuSeconds(pid int) float64 {
	d, _ := hostenv.ProcessCPU(pid)
	return d.Seconds()
}

func TestTrustBoundaries(t *testing.T) {
	e := setup(t)
	d := e.newDaemon(t, defaultLimits)
	agentTok, agentHash, _ := sigils.NewToken()
	greedyTok, greedyHash, _ := sigils.NewToken()
	cfg, err := os.ReadFile(d.config)
	if err != nil {
		t.Fatal(err)
	}
	text := strings.Replace(string(cfg), "[daemon]\n", "[daemon]\ntcp_listen = \"127.0.0.1:0\"\n", 1) +
		"\n[sigils.default]\nscopes = [\"admin\", \"ask\", \"sessions:read\", \"karma:read\", \"karma:write\"]\n" +
		fmt.Sprintf("\n[sigils.agent]\nscopes = [\"ask\"]\ntoken_sha256 = %q\n", agentHash) +
		fmt.Sprintf("\n[sigils.greedy]\nscopes = [\"ask\", \"karma:read\", \"karma:write\"]\ntoken_sha256 = %q\n", greedyHash)
	if err := os.WriteFile(d.config, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	d.start(t)
	defer d.stop(t)
	var st httpapi.Status
	if err := client.New(d.socket).GetJSON(t.Context(), "/v1/status", &st); err != nil || st.Listeners.TCP == "" {
		t.Fatalf("status: %v, tcp %q", err, st.Listeners.TCP)
	}
	addr := st.Listeners.TCP
	base := "http://" + addr
	pid := d.pid()
	idle, _ := procStatus(pid, "VmRSS")

	phase, floodN, wsN, mcpN, karmaN := 8*time.Second, 300, 200, 2000, 60
	if *full {
		phase, floodN, wsN, mcpN, karmaN = 30*time.Second, 3000, 1024, 20000, 300
	}
	measure := func(name string, load func(ctx context.Context)) trustPhase {
		session := "trust-" + strconv.Itoa(len(name)) + "-" + strconv.FormatInt(time.Now().UnixNano(), 36)
		p := trustPhase{name: name, healthErr: map[string]int{}, askErr: map[string]int{}}
		ctx, cancel := context.WithTimeout(t.Context(), phase)
		defer cancel()
		var mu sync.Mutex
		var wg sync.WaitGroup
		cpu0, began := cpuSeconds(pid), time.Now()
		if load != nil {
			wg.Go(func() { load(ctx) })
		}
		wg.Go(func() { // the probe
			hc := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
			for ctx.Err() == nil {
				begin := time.Now()
				resp, err := hc.Get(base + "/v1/health")
				took := ms(time.Since(begin))
				mu.Lock()
				if err != nil || resp.StatusCode != 200 {
					p.healthErr[fmt.Sprint(err, statusOf(resp))]++
				} else {
					p.health = append(p.health, took)
				}
				mu.Unlock()
				if resp != nil {
					resp.Body.Close()
				}
				sleep(ctx, 100*time.Millisecond)
			}
		})
		wg.Go(func() { // the agent
			c := client.NewTCP(base, client.WithToken(agentTok), client.WithTransport(&http.Transport{DisableKeepAlives: true}))
			for i := 0; ctx.Err() == nil; i++ {
				a := ask(context.WithoutCancel(ctx), c, session, "question "+strconv.Itoa(i)+"?", 4)
				mu.Lock()
				if a.err != nil {
					p.askErr[errorClass(a.err)]++
				} else {
					p.ttft = append(p.ttft, ms(a.ttft))
				}
				mu.Unlock()
			}
		})
		wg.Go(func() { // the daemon's memory
			for ctx.Err() == nil {
				if s, err := procStatus(pid, "VmRSS"); err == nil {
					mu.Lock()
					p.peakRSS = max(p.peakRSS, s["VmRSS"])
					mu.Unlock()
				}
				sleep(ctx, 100*time.Millisecond)
			}
		})
		wg.Wait()
		p.daemonCPU = (cpuSeconds(pid) - cpu0) / time.Since(began).Seconds()
		return p
	}

	var phases []trustPhase
	phases = append(phases, measure("quiet", nil))

	// Unauthenticated connections, from another user where the test can
	// run one (root and setpriv), else from this one.
	who := "another uid (65534)"
	var floodCPU float64
	phases = append(phases, measure(fmt.Sprintf("%d unauthenticated slow connections", floodN), func(ctx context.Context) {
		if otheruid.Available() {
			cmd := otheruid.Start(t, "TestUnauthFloodHelper", "flooding", floodEnv+"="+addr, floodNEnv+"="+strconv.Itoa(floodN))
			c0, began := cpuSeconds(cmd.Process.Pid), time.Now()
			<-ctx.Done()
			floodCPU = (cpuSeconds(cmd.Process.Pid) - c0) / time.Since(began).Seconds()
			cmd.Process.Kill()
			return
		} else {
			who = "this uid (no root or setpriv here)"
			for range floodN {
				go func() {
					for ctx.Err() == nil {
						conn, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
						if err != nil {
							sleep(ctx, 100*time.Millisecond)
							continue
						}
						stop := closeOnDone(ctx, conn)
						fmt.Fprint(conn, "POST /v1/ask HTTP/1.1\r\nHost: ctxd\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n{")
						_, _ = bufio.NewReader(conn).ReadByte()
						stop()
						conn.Close()
						sleep(ctx, time.Second) // a slow client, not a busy loop
					}
				}()
			}
		}
		<-ctx.Done()
	}))

	// One token holder opens WebSockets, as many as it may and more.
	phases[len(phases)-1].floodCPU = floodCPU
	var wsHeld, wsRefused atomic.Int64
	phases = append(phases, measure(fmt.Sprintf("one sigil opens %d WebSockets", wsN), func(ctx context.Context) {
		var conns []*websocket.Conn
		var mu sync.Mutex
		var wg sync.WaitGroup
		for range wsN {
			wg.Go(func() {
				ws, _, err := websocket.Dial(ctx, "ws://"+addr+"/v1/ws", &websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer " + greedyTok}}})
				if err != nil {
					wsRefused.Add(1)
					return
				}
				wsHeld.Add(1)
				go func() { // answers pings: a live, idle connection
					for {
						if _, _, err := ws.Read(context.Background()); err != nil {
							return
						}
					}
				}()
				mu.Lock()
				conns = append(conns, ws)
				mu.Unlock()
			})
		}
		wg.Wait()
		<-ctx.Done()
		for _, ws := range conns {
			ws.CloseNow()
		}
	}))

	// MCP initialize calls and karma notes of a megabyte, from one sigil.
	var mcpOK, mcpRefused, notesRefused atomic.Int64
	phases = append(phases, measure(fmt.Sprintf("one sigil sends %d MCP initialize calls and %d karma notes of 1 MB", mcpN, karmaN), func(ctx context.Context) {
		hc := &http.Client{Timeout: 30 * time.Second}
		initialize := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"flood","version":"0"}}}`
		var wg sync.WaitGroup
		for w := range 8 {
			wg.Go(func() {
				for i := w; i < mcpN && ctx.Err() == nil; i += 8 {
					req, _ := http.NewRequestWithContext(ctx, "POST", base+"/v1/mcp", strings.NewReader(initialize))
					req.Header.Set("Authorization", "Bearer "+greedyTok)
					req.Header.Set("Content-Type", "application/json")
					req.Header.Set("Accept", "application/json, text/event-stream")
					resp, err := hc.Do(req)
					if err != nil {
						continue
					}
					resp.Body.Close()
					if resp.StatusCode == 200 {
						mcpOK.Add(1)
					} else if resp.StatusCode == http.StatusTooManyRequests {
						mcpRefused.Add(1)
					}
				}
			})
		}
		wg.Go(func() {
			g := client.NewTCP(base, client.WithToken(greedyTok))
			a := ask(ctx, g, "greedy", "a trace to judge", 4)
			if a.err != nil || a.sum == nil || a.sum.Trace == 0 {
				return
			}
			note := strings.Repeat("n", 1<<20-64)
			for i := 0; i < karmaN && ctx.Err() == nil; i++ {
				if _, err := g.Judge(ctx, a.sum.Trace, ctxd.KarmaVerify, ctxd.KarmaJudgement{Note: note}); ctxd.KindOf(err) == ctxd.KindTooLarge {
					notesRefused.Add(1)
				}
			}
		})
		wg.Wait()
		<-ctx.Done()
	}))

	// What must hold, whatever the timings: health and asks were answered
	// in every phase, the bounds refused what was past them.
	for _, p := range phases {
		if len(p.health) == 0 || len(p.ttft) == 0 {
			t.Errorf("%s: %d health answers, %d asks answered (errors %v, %v)", p.name, len(p.health), len(p.ttft), p.healthErr, p.askErr)
		}
	}
	if wsRefused.Load() == 0 || wsHeld.Load() > 64 {
		t.Errorf("WebSockets: %d held, %d refused; want at most daemon.max_websockets_per_sigil (64) held", wsHeld.Load(), wsRefused.Load())
	}
	if mcpOK.Load() > 64 || mcpRefused.Load() == 0 {
		t.Errorf("MCP sessions: %d begun, %d refused; want at most daemon.max_mcp_sessions_per_sigil (64)", mcpOK.Load(), mcpRefused.Load())
	}
	if notesRefused.Load() == 0 {
		t.Error("no karma note of 1 MB was refused")
	}

	var sb strings.Builder
	fmt.Fprintf(&sb, "Measured by `go test ./reliability -run TestTrustBoundaries -timeout 60m -args -full -write ../docs/reliability.md`, %s, on %s.\n\n",
		time.Now().Format("2006-01-02"), e.machine())
	fmt.Fprintf(&sb, "Each phase runs %s: an agent asks over the TCP listener with its sigil's token (answers of at most 4 tokens, a connection of its own per question), and a probe asks for TCP health every 100 ms (likewise), beside the load the phase names. The unauthenticated connections come from %s: each sends a `POST /v1/ask`'s headers and one byte of its 100,000-byte body without a token, and is opened again a second after the daemon closes it. The WebSockets are one token holder's, each answering pings; the MCP calls and karma notes are the same holder's. The daemon's settings are the defaults (`daemon.max_connections` 1024, `daemon.max_unauthenticated` 64, `daemon.max_websockets_per_sigil` 64, `daemon.max_mcp_sessions_per_sigil` 64, `karma.max_note_bytes` 4096). Resident memory is the daemon's, sampled every 100 ms; idle, before the first phase: %d MB. CPU is each process's user and system time over the phase, as a share of one core (the machine has %d); the model's runner is Ollama's, not counted here.\n\n",
		phase, who, idle["VmRSS"]/1024, runtime.NumCPU())
	sb.WriteString("| phase | health answered | health p50 | health p99 | health max | asks answered | ask TTFT p50 | ask TTFT p95 | TTFT p50 vs quiet | errors | peak RSS | daemon CPU | flood's CPU |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|\n")
	q := quantile(phases[0].ttft, 0.5)
	for _, p := range phases {
		errs := "none"
		if len(p.healthErr)+len(p.askErr) > 0 {
			errs = fmt.Sprintf("health %v, asks %v", p.healthErr, p.askErr)
		}
		flood := "—"
		if p.floodCPU > 0 {
			flood = fmt.Sprintf("%.0f%%", 100*p.floodCPU)
		}
		fmt.Fprintf(&sb, "| %s | %d | %.1f ms | %.1f ms | %.1f ms | %d | %.0f ms | %.0f ms | %+.0f%% | %s | %d MB | %.0f%% | %s |\n",
			p.name, len(p.health), quantile(p.health, 0.5), quantile(p.health, 0.99), quantile(p.health, 1),
			len(p.ttft), quantile(p.ttft, 0.5), quantile(p.ttft, 0.95), 100*(quantile(p.ttft, 0.5)/q-1), errs, p.peakRSS/1024, 100*p.daemonCPU, flood)
	}
	fmt.Fprintf(&sb, "\nOf the WebSockets %d were held and %d refused (429, naming `daemon.max_websockets_per_sigil`); of the MCP initialize calls %d began a session and %d were refused; %d karma notes of 1 MB were refused (413, naming `karma.max_note_bytes`).\n",
		wsHeld.Load(), wsRefused.Load(), mcpOK.Load(), mcpRefused.Load(), notesRefused.Load())
	report(t, "trust", sb.String())
}

// statusOf is a response's status for an error count ("" for none).
func statusOf(resp *http.Response) string {
	if resp == nil {
		return ""
	}
	return resp.Status
}
