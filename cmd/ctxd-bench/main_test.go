package main

import (
	"bytes"
	"strings"
	"testing"
)

// TestUsageAndRefusals: help prints the usage without running anything;
// an argument that is not a flag, or an unknown flag, is refused with an
// error that names it.
func TestUsageAndRefusals(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		args         []string
		code         int
		stdout, errs string
	}{
		{[]string{"help"}, 0, "benchmark harness", ""},
		{[]string{"stray"}, 1, "", `unexpected argument "stray"`},
		{[]string{"--no-such-flag"}, 1, "", "no-such-flag"},
	} {
		var stdout, stderr bytes.Buffer
		if code := run(c.args, &stdout, &stderr); code != c.code || !strings.Contains(stdout.String(), c.stdout) || !strings.Contains(stderr.String(), c.errs) {
			t.Errorf("ctxd-bench %q: exit %d, stdout %q, stderr %q; want %d, %q, %q", c.args, code, stdout.String(), stderr.String(), c.code, c.stdout, c.errs)
		}
	}
}
