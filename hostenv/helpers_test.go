package hostenv

import (
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
)

const gib = 1 << 30

var epoch = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)

// clock is a fake clock: it moves only when a test advances it.
type clock struct {
	mu sync.Mutex // guards t
	t  time.Time
}

func newClock() *clock { return &clock{t: epoch} }

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

func hostMem(total, avail uint64) func() (uint64, uint64, error) {
	return func() (uint64, uint64, error) { return total, avail, nil }
}

// tree is a fake SysRoot.
type tree struct {
	tb   testing.TB
	root string
}

func newTree(tb testing.TB) *tree { return &tree{tb: tb, root: tb.TempDir()} }

// put writes content to rel under the root.
func (tr *tree) put(rel, content string) {
	tr.tb.Helper()
	path := filepath.Join(tr.root, rel)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		tr.tb.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		tr.tb.Fatal(err)
	}
}

// remove deletes rel under the root, if it is there.
func (tr *tree) remove(rel string) {
	tr.tb.Helper()
	if err := os.RemoveAll(filepath.Join(tr.root, rel)); err != nil {
		tr.tb.Fatal(err)
	}
}

// mains writes a mains supply, online or not.
func (tr *tree) mains(online bool) {
	tr.tb.Helper()
	tr.put("sys/class/power_supply/AC/type", "Mains\n")
	tr.put("sys/class/power_supply/AC/online", map[bool]string{true: "1\n", false: "0\n"}[online])
}

// battery writes a battery with a status and a capacity.
func (tr *tree) battery(status string, percent string) {
	tr.tb.Helper()
	tr.put("sys/class/power_supply/BAT0/type", "Battery\n")
	tr.put("sys/class/power_supply/BAT0/status", status+"\n")
	tr.put("sys/class/power_supply/BAT0/capacity", percent+"\n")
}

// route writes a routing table, with a default route or without.
func (tr *tree) route(dflt bool) {
	tr.tb.Helper()
	table := "Iface\tDestination\tGateway\tFlags\nlo\t0000007F\t00000000\t0001\n"
	if dflt {
		table += "eth0\t00000000\t0101A8C0\t0003\n"
	}
	tr.put("proc/net/route", table)
}

// memory is a mock GPU whose used memory a test sets as it goes.
type memory struct {
	mu   sync.Mutex // guards used
	used uint64
}

func (m *memory) set(used uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.used = used
}

// device returns a mock device of total bytes whose use follows m.
func (m *memory) device(dev *mock.Device, total uint64) *mock.Device {
	dev.GetMemoryInfoFunc = func() (nvml.Memory, nvml.Return) {
		m.mu.Lock()
		defer m.mu.Unlock()
		return nvml.Memory{Total: total, Used: m.used, Free: total - m.used}, nvml.SUCCESS
	}
	return dev
}
