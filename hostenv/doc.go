// Package hostenv reads the hardware situation ctxd runs in and reduces it
// to the coarse bands of the RunContext Environment block (block 3).
//
// A Probe takes raw readings (a Reading): per NVIDIA GPU (NVML) its name,
// memory, utilisation, power draw and limit; host memory and the 1-minute
// load average; the power source, battery charge and power profile (from
// sysfs and power-profiles-daemon's state file); and connectivity (a
// default route in /proc/net/route and, when Config.Reachable is set,
// whether the backend answers). A device call that fails leaves its field
// unknown instead of failing the reading; a GPU whose memory cannot be read
// makes that reading fall back to host memory. Readings are JSON-friendly,
// for status pages and the window plan: raw numbers never reach the prompt.
//
// Probe.Run reads every Config.Interval (1 s) and updates the bands;
// Probe.Environment answers at once from the latest ones (ctxd.Sensor).
// Probe.Tick is the single step, for tests on a fake clock (Config.Now).
// Without Run, Environment reads on demand when the last reading is older
// than Config.MaxAge.
//
// # VRAM pressure
//
// The VRAM band is the pressure on the memory the model runs in, ctxd's own
// planned window counted:
//
//	pressure = (used + planned) / total   while the plan is not resident
//	pressure = used / total               once it is (used holds it)
//
// where used and total are VRAM summed over the GPUs NVML reads, or host
// memory (total − available) without one, and planned is what ctxd's
// window plan expects the backend to hold, weights and KV cache (see
// Probe.SetPlan). Pressure above 1 is critical.
//
// # Bands
//
// Bands change with hysteresis and a hold (Thresholds, DefaultThresholds):
// a number enters a higher band at one threshold and leaves it only below
// a lower one, and a band that would change must be what every reading
// says for Thresholds.Hold (10 s) before it shows, so a flap shorter than
// the hold never reaches the prompt and a wobble across one threshold
// never moves the band. The first reading sets every band at once, as does
// a known reading after the band was unknown. The types doing this
// (Scale, Debouncer, Bander) are pure and take the time of each value.
//
//   - vram: low, moderate (0.60/0.55), high (0.80/0.75), critical
//     (0.92/0.88), enter/leave; unknown without a memory reading.
//   - gpu: present (NVML reads a device), none (no NVML, or no device),
//     unknown (NVML started but a device failed).
//   - power, in precedence: low_power (platform profile "low-power" or
//     power-profiles-daemon's "power-saver"), low_battery (discharging
//     under 20 %, until above 25 %), battery, ac; unknown without supplies.
//   - connectivity: online with a default route and, if asked, a backend
//     that answers; offline if either fails; unknown without a readable
//     route table.
//
// Probe.Counters counts readings and band changes, for status.
//
// hostenv does not decide what ctxd does under pressure (the governor and
// the orchestrator do), does not plan the window (governor does, from a
// Reading), and sends no network traffic of its own: Reachable is the
// caller's check.
package hostenv
