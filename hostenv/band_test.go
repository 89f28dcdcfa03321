package hostenv

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"
)

func TestScaleNext(t *testing.T) {
	s := DefaultThresholds().VRAMScale()
	cases := []struct {
		name string
		prev string
		v    float64
		want string
	}{
		{"first value low", "", 0.30, Low},
		{"first value straight to high", Unknown, 0.85, High},
		{"first value critical", "", 0.95, Critical},
		{"low below moderate's enter", Low, 0.59, Low},
		{"low enters moderate at its enter", Low, 0.60, Moderate},
		{"low jumps two bands", Low, 0.81, High},
		{"moderate stays above its leave", Moderate, 0.56, Moderate},
		{"moderate stays at its leave", Moderate, 0.55, Moderate},
		{"moderate leaves below its leave", Moderate, 0.549, Low},
		{"moderate below high's enter", Moderate, 0.79, Moderate},
		{"moderate enters high", Moderate, 0.80, High},
		{"high stays above its leave", High, 0.76, High},
		{"high leaves to moderate", High, 0.74, Moderate},
		{"high falls two bands", High, 0.40, Low},
		{"high enters critical", High, 0.92, Critical},
		{"critical stays above its leave", Critical, 0.89, Critical},
		{"critical leaves to high", Critical, 0.87, High},
		{"critical falls to low", Critical, 0.10, Low},
		{"over 1 is critical", Low, 1.30, Critical},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := s.Next(c.prev, c.v); got != c.want {
				t.Errorf("Next(%q, %.3f) = %q, want %q", c.prev, c.v, got, c.want)
			}
		})
	}
}

// step is one value offered at a time, in seconds from the start, and the
// band that must be reported after it.
type step struct {
	at   int
	cand string
	want string
}

func TestDebouncer(t *testing.T) {
	cases := []struct {
		name    string
		hold    time.Duration
		steps   []step
		changes int
	}{
		{"first value at once", 10 * time.Second, []step{{0, Battery, Battery}}, 0},
		{"flap shorter than hold never shows", 10 * time.Second, []step{
			{0, AC, AC}, {1, Battery, AC}, {2, Battery, AC}, {3, Battery, AC}, {4, AC, AC}, {20, AC, AC},
		}, 0},
		{"change shows once held", 10 * time.Second, []step{
			{0, AC, AC}, {1, Battery, AC}, {10, Battery, AC}, {11, Battery, Battery}, {12, Battery, Battery},
		}, 1},
		{"a new candidate restarts the hold", 10 * time.Second, []step{
			{0, Low, Low}, {1, Moderate, Low}, {8, High, Low}, {12, High, Low}, {18, High, High},
		}, 1},
		{"a return to the band resets the hold", 10 * time.Second, []step{
			{0, AC, AC}, {1, Battery, AC}, {9, AC, AC}, {10, Battery, AC}, {19, Battery, AC}, {20, Battery, Battery},
		}, 1},
		{"known after unknown at once", 10 * time.Second, []step{
			{0, Unknown, Unknown}, {1, Online, Online},
		}, 1},
		{"unknown is held like any band", 10 * time.Second, []step{
			{0, Online, Online}, {1, Unknown, Online}, {5, Unknown, Online}, {11, Unknown, Unknown},
		}, 1},
		{"no hold: every change shows", 0, []step{
			{0, AC, AC}, {1, Battery, Battery}, {2, AC, AC},
		}, 2},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d := Debouncer{Hold: c.hold}
			if d.Band() != Unknown {
				t.Fatalf("band before any value %q, want unknown", d.Band())
			}
			for _, s := range c.steps {
				if got := d.Update(epoch.Add(time.Duration(s.at)*time.Second), s.cand); got != s.want {
					t.Fatalf("t=%ds offered %q: reported %q, want %q", s.at, s.cand, got, s.want)
				}
			}
			if d.Changes() != c.changes {
				t.Errorf("%d changes, want %d", d.Changes(), c.changes)
			}
		})
	}
}

// TestBander runs values through hysteresis and hold together.
func TestBander(t *testing.T) {
	type value struct {
		at   int
		v    float64 // NaN: unknown
		want string
	}
	nan := math.NaN()
	cases := []struct {
		name   string
		values []value
	}{
		{"first value sets the band at once", []value{{0, 0.95, Critical}}},
		{"wobble that dips below the leave threshold stays", []value{
			{0, 0.50, Low}, {1, 0.61, Low}, {2, 0.54, Low}, {3, 0.62, Low}, {5, 0.53, Low}, {14, 0.58, Low},
		}},
		{"entering needs the enter threshold for the hold", []value{
			{0, 0.50, Low}, {1, 0.61, Low}, {4, 0.65, Low}, {8, 0.60, Low}, {11, 0.62, Moderate},
		}},
		{"a reading under the enter threshold restarts the hold", []value{
			{0, 0.50, Low}, {1, 0.61, Low}, {5, 0.58, Low}, {6, 0.63, Low}, {15, 0.70, Low}, {16, 0.61, Moderate},
		}},
		{"leaving needs the leave threshold for the hold", []value{
			{0, 0.85, High}, {1, 0.77, High}, {20, 0.76, High}, {21, 0.70, High}, {30, 0.78, High},
			{31, 0.74, High}, {40, 0.60, High}, {41, 0.58, Moderate},
		}},
		{"an unreadable second keeps the band", []value{
			{0, 0.70, Moderate}, {1, nan, Moderate}, {2, 0.70, Moderate}, {30, 0.70, Moderate},
		}},
		{"unreadable for the hold is unknown, and back at once", []value{
			{0, 0.70, Moderate}, {1, nan, Moderate}, {11, nan, Unknown}, {12, 0.30, Low},
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			b := NewBander(DefaultThresholds().VRAMScale(), 10*time.Second)
			for _, v := range c.values {
				now := epoch.Add(time.Duration(v.at) * time.Second)
				var got string
				if math.IsNaN(v.v) {
					got = b.Unknown(now)
				} else {
					got = b.Update(now, v.v)
				}
				if got != v.want {
					t.Fatalf("t=%ds value %.2f: band %q, want %q", v.at, v.v, got, v.want)
				}
			}
		})
	}
}

func TestPowerBand(t *testing.T) {
	pct := func(n int) *int { return &n }
	th := DefaultThresholds()
	cases := []struct {
		name    string
		p       Power
		wasLow  bool
		want    string
		wantLow bool
	}{
		{"nothing readable", Power{Source: Unknown}, false, Unknown, false},
		{"mains", Power{Source: AC, BatteryPercent: pct(50)}, false, AC, false},
		{"mains after a low battery", Power{Source: AC, BatteryPercent: pct(10)}, true, AC, false},
		{"battery", Power{Source: Battery, Discharging: true, BatteryPercent: pct(60)}, false, Battery, false},
		{"battery without a percentage", Power{Source: Battery, Discharging: true}, false, Battery, false},
		{"battery at the enter threshold", Power{Source: Battery, Discharging: true, BatteryPercent: pct(20)}, false, Battery, false},
		{"battery below it", Power{Source: Battery, Discharging: true, BatteryPercent: pct(19)}, false, LowBattery, true},
		{"low battery recovering, under leave", Power{Source: Battery, Discharging: true, BatteryPercent: pct(24)}, true, LowBattery, true},
		{"low battery at leave", Power{Source: Battery, Discharging: true, BatteryPercent: pct(25)}, true, LowBattery, true},
		{"low battery above leave", Power{Source: Battery, Discharging: true, BatteryPercent: pct(26)}, true, Battery, false},
		{"battery not discharging is not low", Power{Source: Battery, BatteryPercent: pct(5)}, false, Battery, false},
		{"low-power profile on mains", Power{Source: AC, LowPowerMode: true}, false, LowPower, false},
		{"low-power profile beats low battery", Power{Source: Battery, Discharging: true, BatteryPercent: pct(5), LowPowerMode: true}, false, LowPower, true},
		{"low-power profile without supplies", Power{Source: Unknown, LowPowerMode: true}, false, LowPower, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, low := PowerBand(c.p, c.wasLow, th)
			if got != c.want || low != c.wantLow {
				t.Errorf("PowerBand = %q, low %v; want %q, low %v", got, low, c.want, c.wantLow)
			}
		})
	}
}

func TestConnectivityBand(t *testing.T) {
	yes, no := true, false
	cases := []struct {
		name string
		c    Connectivity
		want string
	}{
		{"no route table, not checked", Connectivity{}, Unknown},
		{"no route table, backend answers", Connectivity{Reachable: &yes}, Unknown},
		{"no route table, backend silent", Connectivity{Reachable: &no}, Offline},
		{"default route, not checked", Connectivity{DefaultRoute: &yes}, Online},
		{"default route, backend answers", Connectivity{DefaultRoute: &yes, Reachable: &yes}, Online},
		{"default route, backend silent", Connectivity{DefaultRoute: &yes, Reachable: &no}, Offline},
		{"no default route", Connectivity{DefaultRoute: &no}, Offline},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := ConnectivityBand(c.c); got != c.want {
				t.Errorf("ConnectivityBand = %q, want %q", got, c.want)
			}
		})
	}
}

func TestGPUBand(t *testing.T) {
	cases := map[string]string{NVMLOK: Present, NVMLUnavailable: None, NVMLNoDevices: None, NVMLError: Unknown, "": Unknown}
	for state, want := range cases {
		if got := GPUBand(Reading{NVML: state}); got != want {
			t.Errorf("GPUBand(nvml %q) = %q, want %q", state, got, want)
		}
	}
}

func TestThresholdsValidate(t *testing.T) {
	cases := []struct {
		name  string
		edit  func(*Thresholds)
		field string // "": valid
	}{
		{"defaults", func(*Thresholds) {}, ""},
		{"no hysteresis, no hold", func(th *Thresholds) {
			th.VRAMModerateLeave, th.VRAMHighLeave, th.VRAMCriticalLeave = th.VRAMModerateEnter, th.VRAMHighEnter, th.VRAMCriticalEnter
			th.LowBatteryLeave, th.Hold = th.LowBatteryEnter, 0
		}, ""},
		{"leave above enter", func(th *Thresholds) { th.VRAMHighLeave = 0.85 }, "vram_high_leave"},
		{"enter above 1", func(th *Thresholds) { th.VRAMCriticalEnter = 1.2 }, "vram_critical_enter"},
		{"enter NaN", func(th *Thresholds) { th.VRAMModerateEnter = math.NaN() }, "vram_moderate_enter"},
		{"bands out of order", func(th *Thresholds) { th.VRAMHighEnter, th.VRAMHighLeave = 0.58, 0.50 }, "vram_high_enter"},
		{"leaves out of order", func(th *Thresholds) { th.VRAMHighLeave = 0.52 }, "vram_high_leave"},
		{"zero leave", func(th *Thresholds) { th.VRAMModerateLeave = 0 }, "vram_moderate_leave"},
		{"battery percentage", func(th *Thresholds) { th.LowBatteryEnter = 120 }, "low_battery_enter"},
		{"battery leave under enter", func(th *Thresholds) { th.LowBatteryLeave = 15 }, "low_battery_leave"},
		{"negative hold", func(th *Thresholds) { th.Hold = -time.Second }, "hold"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			th := DefaultThresholds()
			c.edit(&th)
			err := th.Validate()
			if c.field == "" {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				return
			}
			var fe *FieldError
			if !errors.As(err, &fe) || fe.Field != c.field {
				t.Fatalf("Validate: %v; want a FieldError naming %s", err, c.field)
			}
			if !strings.Contains(err.Error(), c.field) {
				t.Errorf("message %q does not name %s", err, c.field)
			}
		})
	}
}
