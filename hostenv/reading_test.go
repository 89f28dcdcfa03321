package hostenv

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/ctxd/ctxd/internal/nvmltest"
)

func TestReadPower(t *testing.T) {
	cases := []struct {
		name        string
		setup       func(*tree)
		source      string
		percent     int // -1: none
		discharging bool
		lowPower    bool
	}{
		{"no supplies", func(*tree) {}, Unknown, -1, false, false},
		{"mains online", func(tr *tree) { tr.mains(true) }, AC, -1, false, false},
		{"mains offline, no battery", func(tr *tree) { tr.mains(false) }, Unknown, -1, false, false},
		{"discharging battery", func(tr *tree) { tr.battery("Discharging", "55") }, Battery, 55, true, false},
		{"battery listed before online mains", func(tr *tree) {
			tr.battery("Charging", "40")
			tr.mains(true)
		}, AC, 40, false, false},
		{"battery, mains offline", func(tr *tree) {
			tr.mains(false)
			tr.battery("Discharging", "18")
		}, Battery, 18, true, false},
		{"two batteries average", func(tr *tree) {
			tr.battery("Discharging", "30")
			tr.put("sys/class/power_supply/BAT1/type", "Battery\n")
			tr.put("sys/class/power_supply/BAT1/status", "Discharging\n")
			tr.put("sys/class/power_supply/BAT1/capacity", "50\n")
		}, Battery, 40, true, false},
		{"a mouse's battery does not count", func(tr *tree) {
			tr.mains(true)
			tr.put("sys/class/power_supply/hidpp_battery_0/type", "Battery\n")
			tr.put("sys/class/power_supply/hidpp_battery_0/scope", "Device\n")
			tr.put("sys/class/power_supply/hidpp_battery_0/status", "Discharging\n")
			tr.put("sys/class/power_supply/hidpp_battery_0/capacity", "5\n")
		}, AC, -1, false, false},
		{"unreadable capacity", func(tr *tree) { tr.battery("Discharging", "n/a") }, Battery, -1, true, false},
		{"platform profile low-power", func(tr *tree) {
			tr.mains(true)
			tr.put("sys/firmware/acpi/platform_profile", "low-power\n")
		}, AC, -1, false, true},
		{"platform profile balanced", func(tr *tree) {
			tr.put("sys/firmware/acpi/platform_profile", "balanced\n")
		}, Unknown, -1, false, false},
		{"power-profiles-daemon power-saver", func(tr *tree) {
			tr.battery("Discharging", "70")
			tr.put("var/lib/power-profiles-daemon/state.ini", "[State]\nDriver=platform_profile\nProfile=power-saver\n")
		}, Battery, 70, true, true},
		{"power-profiles-daemon performance", func(tr *tree) {
			tr.put("var/lib/power-profiles-daemon/state.ini", "[State]\nDriver=platform_profile\nProfile=performance\n")
		}, Unknown, -1, false, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tr := newTree(t)
			c.setup(tr)
			p := readPower(tr.root)
			pct := -1
			if p.BatteryPercent != nil {
				pct = *p.BatteryPercent
			}
			if p.Source != c.source || pct != c.percent || p.Discharging != c.discharging || p.LowPowerMode != c.lowPower {
				t.Errorf("readPower = %+v (percent %d); want source %s, percent %d, discharging %v, low power %v",
					p, pct, c.source, c.percent, c.discharging, c.lowPower)
			}
		})
	}
}

func TestDefaultRoute(t *testing.T) {
	cases := []struct {
		name  string
		table string // "": no file
		want  string
	}{
		{"no route table", "", "nil"},
		{"loopback only", "Iface\tDestination\tGateway\nlo\t0000007F\t00000000\n", "false"},
		{"default on the loopback", "Iface\tDestination\tGateway\nlo\t00000000\t00000000\n", "false"},
		{"default route", "Iface\tDestination\tGateway\neth0\t0001A8C0\t00000000\nwlan0\t00000000\t0101A8C0\n", "true"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tr := newTree(t)
			if c.table != "" {
				tr.put("proc/net/route", c.table)
			}
			got := "nil"
			if r := defaultRoute(tr.root); r != nil {
				got = map[bool]string{true: "true", false: "false"}[*r]
			}
			if got != c.want {
				t.Errorf("defaultRoute = %s, want %s", got, c.want)
			}
		})
	}
}

// TestGPUOptionalCalls: a device whose utilisation, power and name calls
// fail still gives its memory; the other device gives everything.
func TestGPUOptionalCalls(t *testing.T) {
	full := nvmltest.Device("RTX A", 24*gib, 20*gib)
	bare := nvmltest.Unsupported(nvmltest.Device("RTX B", 8*gib, 2*gib))
	limitOnly := nvmltest.Device("RTX C", 16*gib, 16*gib)
	limitOnly.GetEnforcedPowerLimitFunc = func() (uint32, nvml.Return) { return 0, nvml.ERROR_NOT_SUPPORTED }
	limitOnly.GetPowerManagementLimitFunc = func() (uint32, nvml.Return) { return 150_000, nvml.SUCCESS }
	p := New(Config{NVML: nvmltest.Library(full, bare, limitOnly), HostMemory: hostMem(64*gib, 60*gib), SysRoot: t.TempDir()})
	r := p.Read()
	if r.Source != "nvml" || r.GPUs != 3 || r.TotalBytes != 48*gib || r.FreeBytes != 38*gib || r.NVML != NVMLOK {
		t.Fatalf("reading %+v", r)
	}
	if p := *r.Pressure; p < 0.208 || p > 0.209 { // 10 of 48 GiB used
		t.Errorf("pressure %.4f, want 10/48", p)
	}
	a, b, c := r.Devices[0], r.Devices[1], r.Devices[2]
	if a.Name != "RTX A" || a.UsedBytes != 4*gib || a.UtilizationPct == nil || *a.UtilizationPct != nvmltest.UtilizationPct ||
		a.PowerDrawMW == nil || *a.PowerDrawMW != nvmltest.PowerDrawMW || a.PowerLimitMW == nil || *a.PowerLimitMW != nvmltest.PowerLimitMW {
		t.Errorf("full device %+v", a)
	}
	if b.Index != 1 || b.Name != "" || b.TotalBytes != 8*gib || b.FreeBytes != 2*gib ||
		b.UtilizationPct != nil || b.PowerDrawMW != nil || b.PowerLimitMW != nil {
		t.Errorf("bare device %+v", b)
	}
	if c.PowerLimitMW == nil || *c.PowerLimitMW != 150_000 {
		t.Errorf("device without an enforced limit: %+v, want the management limit", c)
	}
}

func TestReadingJSON(t *testing.T) {
	tr := newTree(t)
	tr.battery("Discharging", "42")
	tr.route(true)
	p := New(Config{NVML: nvmltest.GPU(24*gib, 20*gib), HostMemory: hostMem(64*gib, 60*gib), SysRoot: tr.root,
		Load: func() (float64, error) { return 1.25, nil }})
	p.SetPlan(2*gib, false)
	b, err := json.Marshal(p.Read())
	if err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{`"source":"nvml"`, `"total_bytes":`, `"free_bytes":`, `"pressure":`, `"planned_bytes":2147483648`,
		`"utilization_pct":37`, `"power_draw_mw":61000`, `"power_limit_mw":250000`, `"mem_available_bytes":`,
		`"load1":1.25`, `"battery_percent":42`, `"low_power_mode":false`, `"default_route":true`} {
		if !strings.Contains(string(b), key) {
			t.Errorf("JSON lacks %s: %s", key, b)
		}
	}
}
