// Package race says whether the race detector is on (race.Enabled), so
// that tests which count allocations allow for the few the detector adds
// or takes away.
package race

// Slack is how many more allocations than a baseline a count may show
// before it is taken as growth: none, but a few in a hundred under the
// race detector, whose instrumentation allocates now and then.
func Slack(baseline float64) float64 {
	if Enabled {
		return 2 + baseline/50
	}
	return 0
}
