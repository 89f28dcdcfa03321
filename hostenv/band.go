package hostenv

import (
	"slices"
	"time"
)

// Band names, as ctxd.Environment carries them.
const (
	Unknown = "unknown"

	// VRAM pressure.
	Low      = "low"
	Moderate = "moderate"
	High     = "high"
	Critical = "critical"

	// GPU.
	None    = "none"
	Present = "present"

	// Power, highest precedence first.
	LowPower   = "low_power"
	LowBattery = "low_battery"
	Battery    = "battery"
	AC         = "ac"

	// Connectivity.
	Offline = "offline"
	Online  = "online"
)

// Scale is an ordered set of bands over a number, with hysteresis: a value
// enters band i+1 at Enter[i] or above and leaves it only below Leave[i]
// (Leave[i] ≤ Enter[i]; equal means no hysteresis). It is pure.
type Scale struct {
	Bands []string  // lowest first
	Enter []float64 // len(Bands)-1, increasing
	Leave []float64 // len(Bands)-1, increasing
}

// Next returns the band of v for a signal that was in prev. A prev that is
// not one of the bands (the first value) gives v's band with no history.
func (s Scale) Next(prev string, v float64) string {
	i := slices.Index(s.Bands, prev)
	if i < 0 {
		i = 0
	}
	up := false
	for i < len(s.Enter) && v >= s.Enter[i] {
		i, up = i+1, true
	}
	for !up && i > 0 && v < s.Leave[i-1] {
		i--
	}
	return s.Bands[i]
}

// Debouncer reports a band only once it has held: a candidate different
// from the reported band must be offered for Hold (from the first time it
// was offered, without another candidate in between) before the reported
// band changes, so a flap shorter than Hold never shows. The first band
// offered, and any known band offered while the reported one is Unknown, is
// taken at once. It keeps no clock: the caller passes the time of each
// value. The zero Debouncer holds for no time.
type Debouncer struct {
	Hold time.Duration

	band    string // reported; "" before the first Update
	cand    string // the candidate being held
	since   time.Time
	changes int
}

// Update offers the band a value at now falls in and returns the reported band.
func (d *Debouncer) Update(now time.Time, candidate string) string {
	switch {
	case d.band == "":
		d.band, d.cand = candidate, candidate
	case candidate == d.band:
		d.cand = candidate
	case d.band == Unknown:
		d.commit(candidate)
	default:
		if candidate != d.cand {
			d.cand, d.since = candidate, now
		}
		if now.Sub(d.since) >= d.Hold {
			d.commit(candidate)
		}
	}
	return d.band
}

func (d *Debouncer) commit(band string) {
	d.band, d.cand = band, band
	d.changes++
}

// Band returns the reported band: Unknown before the first Update.
func (d *Debouncer) Band() string {
	if d.band == "" {
		return Unknown
	}
	return d.band
}

// Changes counts the changes of the reported band after the first Update.
func (d *Debouncer) Changes() int { return d.changes }

// Bander bands a number with a Scale's hysteresis and a Debouncer's hold.
// Each value's candidate band is the Scale's band for it from the reported
// band, so a candidate above the reported band needs the value at or above
// an enter threshold and one below it needs the value under a leave
// threshold, on every reading of the hold: any reading back inside the
// reported band's hysteresis range drops the candidate. A value wobbling
// across one threshold never moves the band; one wobbling across the whole
// hysteresis gap moves it only if it stays beyond one edge for the hold.
// It is pure: the caller passes the time of each value.
type Bander struct {
	Scale Scale
	Debouncer
}

// NewBander returns a Bander over s that holds for hold.
func NewBander(s Scale, hold time.Duration) *Bander {
	return &Bander{Scale: s, Debouncer: Debouncer{Hold: hold}}
}

// Update offers v, measured at now, and returns the reported band.
func (b *Bander) Update(now time.Time, v float64) string {
	return b.Debouncer.Update(now, b.Scale.Next(b.band, v))
}

// Unknown offers "nothing could be read" at now and returns the reported
// band: Unknown only once that has lasted for the hold.
func (b *Bander) Unknown(now time.Time) string {
	return b.Debouncer.Update(now, Unknown)
}

// GPUBand is the GPU band of a reading: present when NVML read a device,
// none when there is no NVML, it failed to start or sees no device, and
// unknown when it started but a device could not be read.
func GPUBand(r Reading) string {
	switch r.NVML {
	case NVMLOK:
		return Present
	case NVMLUnavailable, NVMLNoDevices:
		return None
	}
	return Unknown
}

// PowerBand is the power band of a reading, with the low-battery
// hysteresis: wasLow says whether the battery counted as low before; the
// second result says whether it does now. Precedence: low_power (the
// platform or power-profiles-daemon in its power-saving profile) >
// low_battery (discharging under th's threshold) > battery > ac.
func PowerBand(p Power, wasLow bool, th Thresholds) (string, bool) {
	low := false
	if p.Source == Battery && p.Discharging && p.BatteryPercent != nil {
		pct := float64(*p.BatteryPercent)
		low = pct < th.LowBatteryEnter || wasLow && pct <= th.LowBatteryLeave
	}
	switch {
	case p.LowPowerMode:
		return LowPower, low
	case low:
		return LowBattery, low
	case p.Source == Battery, p.Source == AC:
		return p.Source, low
	}
	return Unknown, low
}

// ConnectivityBand is the connectivity band of a reading, in three-valued
// logic: online takes a default route and, when the backend was checked,
// its answer; either one failing is offline; an unreadable route table
// with nothing failing is unknown.
func ConnectivityBand(c Connectivity) string {
	if c.Reachable != nil && !*c.Reachable || c.DefaultRoute != nil && !*c.DefaultRoute {
		return Offline
	}
	if c.DefaultRoute == nil {
		return Unknown
	}
	return Online
}
