package reliability

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/client"
	"github.com/ctxd/ctxd/internal/ollamatest"
	"github.com/ctxd/ctxd/internal/testwatch"
	"github.com/ctxd/ctxd/modelgen"
	"github.com/ctxd/ctxd/ollama"
)

var (
	full  = flag.Bool("full", false, "measure the full figures (minutes) instead of the small CI versions")
	write = flag.String("write", "", "write the measured section into this Markdown file (docs/reliability.md)")
)

// slots is how many sequences the shared Ollama serves at once, and the
// daemons' backend.slots.
const slots = 2

// modelName is the generated model's name on the shared Ollama.
const modelName = "ctxd-rel"

func TestMain(m *testing.M) {
	flag.Parse()
	stop := testwatch.Watch(nil)
	code := m.Run()
	stop()
	if shared.env != nil {
		shared.env.close()
	}
	os.Exit(code)
}

// env is what every test shares: the daemon binary built from cmd/ctxd
// and one external `ollama serve` with the model imported and loaded, so
// that a daemon restarts in a second instead of starting a server.
type env struct {
	dir    string // the binary, the Ollama files
	ctxd   string // the daemon binary
	ollama *ollama.Server
	server string // which Ollama: the binary's name (bin/ollama links to the pinned version)
}

var shared struct {
	once sync.Once
	env  *env
	err  error
}

// setup returns the shared environment, making it on first use; it skips
// (or fails, under CTXD_REQUIRE_OLLAMA) without the Ollama binary.
func setup(t *testing.T) *env {
	t.Helper()
	bin := ollamatest.Binary(t)
	gguf := ollamatest.Model(t, testModel())
	shared.once.Do(func() { shared.env, shared.err = newEnv(bin, gguf) })
	if shared.err != nil {
		t.Fatal(shared.err)
	}
	return shared.env
}

// testModel is the integration tests' model (the file is shared with
// them): small enough that a short answer takes a few milliseconds.
func testModel() modelgen.Config {
	c := modelgen.DefaultConfig()
	c.Name = "ctxd-test"
	c.VocabSize = 2048
	c.ContextLength = 8192
	return c
}

func newEnv(ollamaBin, gguf string) (_ *env, err error) {
	dir, err := os.MkdirTemp("", "ctxd-rel-")
	if err != nil {
		return nil, fmt.Errorf("reliability: %w", err)
	}
	e := &env{dir: dir, ctxd: filepath.Join(dir, "ctxd"), server: filepath.Base(ollamaBin)}
	if real, err := filepath.EvalSymlinks(ollamaBin); err == nil {
		e.server = filepath.Base(real)
	}
	defer func() {
		if err != nil {
			e.close()
		}
	}()
	goBin, err := exec.LookPath("go")
	if err != nil {
		return nil, fmt.Errorf("reliability: the go command, to build the daemon: %w", err)
	}
	out, err := exec.Command(goBin, "build", "-o", e.ctxd, "github.com/ctxd/ctxd/cmd/ctxd").CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("reliability: build cmd/ctxd: %w\n%s", err, out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	e.ollama, err = ollama.Start(context.Background(), ollama.ServeConfig{
		Binary: ollamaBin, Addr: "127.0.0.1:0", NumParallel: slots,
		ModelsDir: filepath.Join(dir, "models"), HomeDir: filepath.Join(dir, "home"),
		LogPath: filepath.Join(dir, "ollama.log"), Env: []string{"PATH=" + os.Getenv("PATH")},
	})
	if err != nil {
		return nil, fmt.Errorf("reliability: start ollama: %w", err)
	}
	c := ollama.New(e.ollama.URL(), modelName, ollama.Options{Dial: e.ollama.DialContext})
	if err := c.Import(ctx, gguf); err != nil {
		return nil, fmt.Errorf("reliability: import the model: %w", err)
	}
	return e, nil
}

func (e *env) close() {
	if e.ollama != nil {
		e.ollama.Close()
	}
	os.RemoveAll(e.dir)
}

// limits are the daemon settings a test varies.
type limits struct {
	maxConnections int
	bodyTimeout    time.Duration
	idleTimeout    time.Duration
}

// defaultLimits are config.Default's.
var defaultLimits = limits{maxConnections: 1024, bodyTimeout: 30 * time.Second, idleTimeout: 2 * time.Minute}

// daemonProc is one ctxd process at a time over one state directory and
// socket: started, killed and started again.
type daemonProc struct {
	socket   string
	stateDir string
	config   string
	logPath  string
	bin      string

	mu     sync.Mutex // guards cmd and exited
	cmd    *exec.Cmd
	exited chan struct{} // closed when cmd has been waited for
}

// newDaemon writes a configuration on the shared Ollama and returns the
// daemon, not started. At cleanup a running daemon is killed, and on
// failure the tail of its log is shown.
func (e *env) newDaemon(t *testing.T, l limits) *daemonProc {
	t.Helper()
	sockDir, err := os.MkdirTemp("", "ctxd-rel-sock-") // t.TempDir can be too long for a socket path
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(sockDir) })
	dir := t.TempDir()
	p := &daemonProc{socket: filepath.Join(sockDir, "ctxd.sock"), stateDir: filepath.Join(dir, "state"),
		config: filepath.Join(dir, "ctxd.toml"), logPath: filepath.Join(dir, "ctxd.log"), bin: e.ctxd}
	cfg := fmt.Sprintf(`[daemon]
socket = %q
state_dir = %q
log_level = "info"
max_connections = %d
body_timeout = %q
idle_timeout = %q

[backend]
kind = "ollama"
mode = "external"
url = %q
model = %q
num_ctx = 4096
slots = %d

[limits]
answer_reserve = 16
`, p.socket, p.stateDir, l.maxConnections, l.bodyTimeout.String(), l.idleTimeout.String(), e.ollama.URL().String(), modelName, slots)
	if err := os.WriteFile(p.config, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		p.kill()
		if t.Failed() {
			t.Logf("daemon log (tail):\n%s", tail(p.logPath, 40))
		}
	})
	return p
}

// start runs the daemon and waits until it answers health as ready;
// it returns how long that took.
func (p *daemonProc) start(t *testing.T) time.Duration {
	t.Helper()
	logf, err := os.OpenFile(p.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close() // the child holds its own descriptor
	cmd := exec.Command(p.bin, "serve", "--config", p.config)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + filepath.Dir(p.stateDir)}
	cmd.Stdout, cmd.Stderr = logf, logf
	begin := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatalf("start ctxd: %v", err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	p.mu.Lock()
	p.cmd, p.exited = cmd, exited
	p.mu.Unlock()
	c := client.New(p.socket)
	deadline := time.Now().Add(2 * time.Minute)
	for {
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
		err := c.Health(ctx)
		cancel()
		if err == nil {
			return time.Since(begin)
		}
		select {
		case <-exited:
			t.Fatalf("ctxd exited before it was ready: %v\n%s", cmd.ProcessState, tail(p.logPath, 30))
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("ctxd not ready within 2 minutes: %v\n%s", err, tail(p.logPath, 30))
		}
	}
}

// pid is the running daemon's process id.
func (p *daemonProc) pid() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cmd.Process.Pid
}

// kill9 sends SIGKILL and waits for the process to be gone.
func (p *daemonProc) kill9(t *testing.T) {
	t.Helper()
	if !p.kill() {
		t.Fatal("kill -9: the daemon was not running")
	}
}

// kill sends SIGKILL to a running daemon and waits for it; false if none
// was running.
func (p *daemonProc) kill() bool {
	p.mu.Lock()
	cmd, exited := p.cmd, p.exited
	p.cmd = nil
	p.mu.Unlock()
	if cmd == nil {
		return false
	}
	_ = cmd.Process.Signal(syscall.SIGKILL)
	<-exited
	return true
}

// stop asks the daemon to stop (SIGTERM) and waits for it.
func (p *daemonProc) stop(t *testing.T) {
	t.Helper()
	p.mu.Lock()
	cmd, exited := p.cmd, p.exited
	p.cmd = nil
	p.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-exited:
		if !cmd.ProcessState.Success() {
			t.Errorf("ctxd stopped with %v", cmd.ProcessState)
		}
	case <-time.After(time.Minute):
		_ = cmd.Process.Kill()
		<-exited
		t.Errorf("ctxd did not stop within a minute of SIGTERM")
	}
}

// procStatus reads fields of /proc/PID/status in kB (or counts).
func procStatus(pid int, fields ...string) (map[string]int64, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return nil, fmt.Errorf("reliability: %w", err)
	}
	out := map[string]int64{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok || !slices.Contains(fields, k) {
			continue
		}
		f := strings.Fields(v)
		if len(f) == 0 {
			continue
		}
		n, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			return nil, fmt.Errorf("reliability: /proc/%d/status %s %q: %w", pid, k, v, err)
		}
		out[k] = n
	}
	return out, nil
}

// goroutines reads go_goroutines from GET /metrics; false when the daemon
// serves no metrics.
func goroutines(ctx context.Context, c *client.Client) (int, bool) {
	body, err := c.GetRaw(ctx, "/metrics")
	if err != nil {
		return 0, false
	}
	for line := range strings.SplitSeq(string(body), "\n") {
		if v, ok := strings.CutPrefix(line, "go_goroutines "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			return int(f), err == nil
		}
	}
	return 0, false
}

// asked is one ask as its agent saw it.
type asked struct {
	sum    *ctxd.Summary
	answer string
	ttft   time.Duration // from sending to the first token, as the client sees it
	total  time.Duration
	err    error
}

// ask sends one question and collects its answer.
func ask(ctx context.Context, c *client.Client, session, query string, maxTokens int) asked {
	var sb strings.Builder
	begin := time.Now()
	var first time.Duration
	sum, err := c.Ask(ctx, ctxd.AskRequest{Session: session, Query: query, MaxTokens: maxTokens}, func(s string) {
		if sb.Len() == 0 && first == 0 {
			first = time.Since(begin)
		}
		sb.WriteString(s)
	})
	a := asked{sum: sum, answer: sb.String(), total: time.Since(begin), err: err}
	a.ttft = first
	if first == 0 { // an empty answer: the summary is the first thing back
		a.ttft = a.total
	}
	return a
}

// errorClass names an error for the tables: the daemon's error kind, or
// what went wrong on the way.
func errorClass(err error) string {
	var api *client.APIError
	switch {
	case errors.As(err, &api):
		return fmt.Sprintf("%s (HTTP %d)", api.Kind, api.Status)
	case errors.Is(err, context.DeadlineExceeded):
		return "client timeout"
	case errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ENOENT):
		return "connection refused"
	case errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE):
		return "connection reset"
	case strings.Contains(err.Error(), "EOF"):
		return "connection closed"
	}
	return "other: " + err.Error()
}

// quantile is the q-quantile (0..1) of xs, nearest rank; NaN for none.
func quantile(xs []float64, q float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	i := int(math.Ceil(q*float64(len(s)))) - 1
	return s[min(max(i, 0), len(s)-1)]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// machine says where the figures were measured.
func (e *env) machine() string {
	return fmt.Sprintf("%s/%s, %d CPUs (shared with other work: the figures are noisy), %s, Ollama %s, model %s (generated by modelgen, %d-token vocabulary)",
		runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), runtime.Version(), e.server, modelName, testModel().VocabSize)
}

// report writes a section of docs/reliability.md (with -write), or logs
// it.
func report(t *testing.T, name, body string) {
	t.Helper()
	if *write == "" {
		t.Logf("section %s (not written: no -write):\n%s", name, body)
		return
	}
	if !*full {
		t.Fatalf("-write needs -full: the small CI versions are not the figures")
	}
	if err := writeSection(*write, name, body); err != nil {
		t.Fatal(err)
	}
	t.Logf("wrote section %s of %s", name, *write)
}

// writeSection replaces what stands between the section's markers.
func writeSection(path, name, body string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("reliability: %w", err)
	}
	open, end := "<!-- reliability:"+name+" -->", "<!-- /reliability:"+name+" -->"
	text := string(data)
	i, j := strings.Index(text, open), strings.Index(text, end)
	if i < 0 || j < i {
		return fmt.Errorf("reliability: %s has no section %s (markers %s ... %s)", path, name, open, end)
	}
	text = text[:i+len(open)] + "\n" + strings.TrimSpace(body) + "\n" + text[j:]
	tmp := path + ".tmp-" + name
	if err := os.WriteFile(tmp, []byte(text), 0o644); err != nil {
		return fmt.Errorf("reliability: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("reliability: %w", err)
	}
	return nil
}

// tail is the last n lines of a file.
func tail(path string, n int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// sleep waits d or until ctx ends; false if it ended.
func sleep(ctx context.Context, d time.Duration) bool {
	select {
	case <-ctx.Done():
		return false
	case <-time.After(d):
		return true
	}
}
