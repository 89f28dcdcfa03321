package hostenv

import (
	"errors"
	"fmt"
	"time"
)

// Thresholds are where the bands change. VRAM pressure is a fraction of
// the memory the model runs in (see the package doc); a band is entered at
// its Enter value or above and left only below its Leave value. A
// discharging battery counts as low below LowBatteryEnter percent and
// stops counting above LowBatteryLeave. A band that would change must hold
// for Hold first. The daemon exposes them under [environment].
type Thresholds struct {
	VRAMModerateEnter float64       `toml:"vram_moderate_enter" json:"vram_moderate_enter"`
	VRAMModerateLeave float64       `toml:"vram_moderate_leave" json:"vram_moderate_leave"`
	VRAMHighEnter     float64       `toml:"vram_high_enter" json:"vram_high_enter"`
	VRAMHighLeave     float64       `toml:"vram_high_leave" json:"vram_high_leave"`
	VRAMCriticalEnter float64       `toml:"vram_critical_enter" json:"vram_critical_enter"`
	VRAMCriticalLeave float64       `toml:"vram_critical_leave" json:"vram_critical_leave"`
	LowBatteryEnter   float64       `toml:"low_battery_enter" json:"low_battery_enter"` // percent
	LowBatteryLeave   float64       `toml:"low_battery_leave" json:"low_battery_leave"` // percent
	Hold              time.Duration `toml:"hold" json:"hold"`                           // for every band
}

// DefaultThresholds returns the thresholds ctxd ships with.
func DefaultThresholds() Thresholds {
	return Thresholds{
		VRAMModerateEnter: 0.60, VRAMModerateLeave: 0.55,
		VRAMHighEnter: 0.80, VRAMHighLeave: 0.75,
		VRAMCriticalEnter: 0.92, VRAMCriticalLeave: 0.88,
		LowBatteryEnter: 20, LowBatteryLeave: 25,
		Hold: 10 * time.Second,
	}
}

// VRAMScale is the pressure scale the thresholds describe.
func (t Thresholds) VRAMScale() Scale {
	return Scale{
		Bands: []string{Low, Moderate, High, Critical},
		Enter: []float64{t.VRAMModerateEnter, t.VRAMHighEnter, t.VRAMCriticalEnter},
		Leave: []float64{t.VRAMModerateLeave, t.VRAMHighLeave, t.VRAMCriticalLeave},
	}
}

// FieldError is a threshold that cannot work; Field is its TOML key.
type FieldError struct {
	Field   string
	Problem string
}

func (e *FieldError) Error() string { return "hostenv: " + e.Field + ": " + e.Problem }

// Validate returns every threshold that cannot work, each a *FieldError
// naming it, joined; nil if all can.
func (t Thresholds) Validate() error {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, &FieldError{Field: field, Problem: fmt.Sprintf(format, args...)})
	}
	type edge struct {
		enterName, leaveName string
		enter, leave         float64
	}
	edges := []edge{
		{"vram_moderate_enter", "vram_moderate_leave", t.VRAMModerateEnter, t.VRAMModerateLeave},
		{"vram_high_enter", "vram_high_leave", t.VRAMHighEnter, t.VRAMHighLeave},
		{"vram_critical_enter", "vram_critical_leave", t.VRAMCriticalEnter, t.VRAMCriticalLeave},
	}
	for i, e := range edges {
		if !(e.enter > 0 && e.enter <= 1) { // written so that NaN fails
			bad(e.enterName, "%v must be above 0 and at most 1", e.enter)
		}
		if !(e.leave > 0 && e.leave <= e.enter) {
			bad(e.leaveName, "%v must be above 0 and at most %s (%v)", e.leave, e.enterName, e.enter)
		}
		if i > 0 {
			if p := edges[i-1]; !(e.enter > p.enter) {
				bad(e.enterName, "%v must be above %s (%v)", e.enter, p.enterName, p.enter)
			} else if !(e.leave > p.leave) {
				bad(e.leaveName, "%v must be above %s (%v)", e.leave, p.leaveName, p.leave)
			}
		}
	}
	if !(t.LowBatteryEnter >= 0 && t.LowBatteryEnter <= 100) {
		bad("low_battery_enter", "%v must be a percentage, 0 to 100", t.LowBatteryEnter)
	}
	if !(t.LowBatteryLeave >= t.LowBatteryEnter && t.LowBatteryLeave <= 100) {
		bad("low_battery_leave", "%v must be at least low_battery_enter (%v) and at most 100", t.LowBatteryLeave, t.LowBatteryEnter)
	}
	if t.Hold < 0 || t.Hold > 10*time.Minute {
		bad("hold", "%v must be between 0s and 10m", t.Hold)
	}
	return errors.Join(errs...)
}
