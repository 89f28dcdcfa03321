package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/httpapi"
)

// cmdStatus prints the daemon's state: an overview for a person, or the
// JSON of GET /v1/status with --json (for scripts: the overview's wording
// may change, the JSON's fields do not).
func cmdStatus(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("status", flag.ContinueOnError)
	socket := fs.String("socket", "", "daemon socket")
	asJSON := fs.Bool("json", false, "print the JSON of GET /v1/status")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("status: unexpected argument %q", fs.Arg(0))
	}
	b, err := clientFor(*socket).GetRaw(context.Background(), "/v1/status")
	if err != nil {
		return err
	}
	if *asJSON {
		_, err = stdout.Write(b)
		return err
	}
	var st httpapi.Status
	if err := json.Unmarshal(b, &st); err != nil {
		return fmt.Errorf("status: the daemon's answer is not a status: %w", err)
	}
	_, err = io.WriteString(stdout, formatStatus(st))
	return err
}

// formatStatus is the overview: one labelled line per part of the daemon,
// the reasons behind its choices kept (window, format, codex mode).
func formatStatus(st httpapi.Status) string {
	var o overview
	state := "ready"
	if !st.Ready {
		state = "starting"
		if st.Error != "" {
			state = "starting: backend not ready: " + st.Error
		}
	}
	o.line("ctxd", "%s · %s", st.Version, state)

	b := st.Backend
	backend := b.Mode // not ready: the kind and version are not known yet
	if b.Kind != "" {
		backend = strings.Join(nonEmpty(b.Kind, b.Version, "("+b.Mode+")"), " ")
	}
	if b.URL != "" {
		backend += " at " + b.URL
	}
	model := b.Model
	if b.Architecture != "" {
		model += fmt.Sprintf(" (%s, trained for %d tokens)", b.Architecture, b.TrainedCtx)
	}
	backend += " · model " + model
	if b.ModelLoads != nil {
		backend += fmt.Sprintf(" · loaded %s", times(*b.ModelLoads))
	}
	if b.Restarts > 0 {
		backend += fmt.Sprintf(" · restarted %s", times(b.Restarts))
	}
	o.line("backend", "%s", backend)
	if !st.Ready {
		o.line("listening", "%s", listening(st.Listeners))
		o.common(st)
		return o.String()
	}

	if w := st.Window; w != nil {
		o.line("window", "num_ctx %d × %s · KV cache %s %s (%s a token) · weights %s · %s",
			w.NumCtx, plural(w.Slots, "slot"), w.CacheType, bytesIEC(w.KVBytes), bytesIEC(int64(w.KVPerToken)), bytesIEC(w.WeightsBytes), w.Reason)
		if m := w.Memory; m.Total > 0 {
			o.line("", "memory (%s): %s free of %s, %s headroom kept", m.Source, bytesIEC(int64(m.Free)), bytesIEC(int64(m.Total)), bytesIEC(w.HeadroomBytes))
		}
	}
	l := st.Limits
	limits := fmt.Sprintf("answer reserve %d tokens · history %s deep", l.AnswerReserve, plural(l.MaxDepth, "turn"))
	if l.MaxDepth == 0 {
		limits = fmt.Sprintf("answer reserve %d tokens · history not limited", l.AnswerReserve)
	}
	if l.MaxChars > 0 {
		limits += fmt.Sprintf(" · at most %d characters a prompt", l.MaxChars)
	}
	o.line("limits", "%s", limits)
	f := b.Format
	format := f.Name
	if f.AppendOnly {
		format += ", append-only"
	}
	o.line("format", "%s: %s", format, strings.Join(nonEmpty(f.Reason, f.Note), "; "))

	if ps := st.Personas; ps != nil {
		o.line("personas", "%s planned of a %s memory budget", bytesIEC(ps.PlannedBytes), bytesIEC(ps.BudgetBytes))
		for _, p := range ps.Personas {
			line := fmt.Sprintf("%s: %s · %s planned (num_ctx %d × %s)", p.Name, p.State, bytesIEC(p.PlannedBytes), p.NumCtx, plural(p.Slots, "slot"))
			switch {
			case p.VRAM > 0:
				line += fmt.Sprintf(" · server holds %s of VRAM (%s), %s resident", bytesIEC(p.VRAM), p.OffBy, bytesIEC(p.RSS))
			case p.RSS > 0:
				line += fmt.Sprintf(" · server holds %s (%s)", bytesIEC(p.RSS), p.OffBy)
			}
			if p.SavedSlots > 0 {
				line += fmt.Sprintf(" · on disk: %s, %d tokens, %s", plural(p.SavedSlots, "slot"), p.SavedTokens, bytesIEC(p.SavedBytes))
			}
			if p.Evacuations > 0 {
				line += fmt.Sprintf(" · evacuated %s", times(p.Evacuations))
				if p.Restores > 0 {
					line += fmt.Sprintf(", restored %s", times(p.Restores))
				}
			}
			var notes []string
			if p.Default {
				notes = append(notes, "default")
			}
			if p.Pinned {
				notes = append(notes, "pinned")
			}
			if len(notes) > 0 {
				line += " · " + strings.Join(notes, ", ")
			}
			o.line("", "%s", line)
		}
	}

	if c := st.Codex; c != nil {
		tokens := fmt.Sprintf("%d tokens", c.Tokens)
		if !c.TokensExact {
			tokens = fmt.Sprintf("%d tokens counted so far", c.Tokens)
			if p := c.Counting; p != nil {
				tokens += fmt.Sprintf(" (%.0f%% of %d files)", p.Percent, p.TotalFiles)
			}
		}
		o.line("codex", "%s (%s) · %s, %s · loaded in %.0f ms", c.Name, c.Root, plural(c.Files, "file"), tokens, c.LoadMillis)
		o.line("", "%s: %s", strings.ToUpper(c.Plan.Mode), c.Plan.Reason)
		var notes []string
		if len(c.Skipped) > 0 {
			notes = append(notes, plural(len(c.Skipped), "file")+" skipped")
		}
		if c.Redactions > 0 {
			notes = append(notes, plural(c.Redactions, "credential")+" redacted")
		}
		if len(notes) > 0 {
			o.line("", "%s (ctxd codex stats)", strings.Join(notes, ", "))
		}
	} else {
		o.line("codex", "none loaded (ctxd codex load PATH)")
	}

	if s := st.Scheduler; s != nil {
		for i, sl := range s.Slots {
			label := ""
			if i == 0 {
				label = "slots"
			}
			state := "idle"
			if sl.Busy {
				state = "busy"
			}
			switch {
			case sl.HeldTokens > 0 && sl.Session != "":
				state += fmt.Sprintf(", warm for session %s (%d tokens held", sl.Session, sl.HeldTokens)
				if sl.MeasuredCached != nil {
					state += fmt.Sprintf(", %d reused last", *sl.MeasuredCached)
				}
				state += ")"
			case sl.HeldTokens > 0:
				state += fmt.Sprintf(", %d tokens held", sl.HeldTokens)
			default:
				state += ", empty"
			}
			o.line(label, "%d: %s", sl.Slot, state)
		}
		queue := fmt.Sprintf("%d waiting for a slot, %d for their session's earlier request", len(s.Waiting), s.InSessions)
		if len(s.Waiting) > 0 {
			w := s.Waiting[0]
			queue += fmt.Sprintf(" · oldest: session %s, %.0f ms", w.Session, w.WaitingMs)
		}
		o.line("queue", "%s", queue)
	}
	o.line("sessions", "%d", st.Sessions)
	if r := st.LastRequest; r != nil {
		o.line("last request", "%s", lastRequest(r))
		if b := r.Budget; len(b.Blocks) > 0 {
			var blocks []string
			for _, u := range b.Blocks {
				blocks = append(blocks, fmt.Sprintf("%s %d", u.Block, u.Tokens))
			}
			o.line("", "%d of %d tokens, %d kept for the answer: %s", b.PromptTokens, b.NumCtx, b.AnswerReserve, strings.Join(blocks, " · "))
		}
		for _, a := range r.Governor {
			o.line("", "governor %s: %s", a.Kind, a.Reason)
		}
	}
	o.line("listening", "%s", listening(st.Listeners))
	o.common(st)
	return o.String()
}

// common are the lines a starting daemon has too.
func (o *overview) common(st httpapi.Status) {
	e := st.Environment
	env := fmt.Sprintf("VRAM %s · GPU %s · power %s · connectivity %s", e.VRAM, e.GPU, e.Power, e.Connectivity)
	if h := st.Hardware; h != nil && h.TotalBytes > 0 {
		env += fmt.Sprintf(" (%s: %s free of %s)", h.Source, bytesIEC(int64(h.FreeBytes)), bytesIEC(int64(h.TotalBytes)))
	}
	o.line("environment", "%s", env)
	if c := st.Bands; c != nil {
		o.line("", "%d readings, the bands changed %s", c.Readings, times(c.Environment))
	}
	var sigils []string
	for _, s := range st.Sigils {
		d := s.Name + " (" + strings.Join(s.Scopes, ", ")
		if s.Token {
			d += "; token"
		}
		if s.Revoked {
			d += "; revoked"
		}
		sigils = append(sigils, d+")")
	}
	karma := "off"
	if st.Karma {
		karma = "on: answers are recorded as traces"
	}
	o.line("sigils", "%s", strings.Join(sigils, " · "))
	o.line("trust", "%s", st.Listeners.Trust)
	o.line("karma", "%s", karma)
	if len(st.Bounds) > 0 {
		var bs []string
		for _, b := range st.Bounds {
			d := fmt.Sprintf("%s %d", strings.TrimPrefix(strings.TrimPrefix(b.Key, "daemon."), "karma."), b.Limit)
			if b.InUse != nil {
				d += fmt.Sprintf(" (%d in use)", *b.InUse)
			}
			if len(b.BySigil) > 0 {
				var by []string
				for _, name := range slices.Sorted(maps.Keys(b.BySigil)) {
					by = append(by, fmt.Sprintf("%s %d", name, b.BySigil[name]))
				}
				d += " [" + strings.Join(by, ", ") + "]"
			}
			bs = append(bs, d)
		}
		o.line("bounds", "%s", strings.Join(bs, " · "))
	}
	if st.LogLevel != "" {
		o.line("log level", "%s", st.LogLevel)
	}
	if st.Config != "" {
		o.line("config", "%s", st.Config)
	}
	if r := st.Reload; r != nil {
		at := r.At.Format("2006-01-02 15:04:05 -07:00") // the daemon's clock and zone
		if r.OK {
			reload := "last reload " + at + ": in force"
			if len(r.Applied) > 0 {
				reload += " (" + strings.Join(r.Applied, ", ") + ")"
			}
			if len(r.NeedsRestart) > 0 {
				reload += "; needs a restart: " + strings.Join(r.NeedsRestart, ", ")
			}
			o.line("reload", "%s", reload)
		} else {
			o.line("reload", "last reload %s REFUSED, the previous configuration stays in force: %s", at, r.Error)
		}
	}
}

func lastRequest(r *ctxd.Summary) string {
	s := fmt.Sprintf("session %s turn %d · %s · %d prompt tokens, %d cached (%.1f%%), %d evaluated · ttft %.0f ms",
		r.Session, r.Turn, r.Mode, r.PromptTokens, r.CachedTokens, r.ReusePercent, r.EvaluatedTokens, r.TTFTMillis)
	t := r.Timing
	s += fmt.Sprintf(" (queue %.0f, governor %.0f, backend %.0f ms)", t.QueueWaitMs, t.GovernorMs, t.BackendTTFTMs)
	if r.PrefixBreak != nil {
		s += fmt.Sprintf(" · prefix broke at %s: %s", r.PrefixBreak.Block, r.PrefixBreak.Reason)
	} else if r.PrefixNote != "" {
		s += " · " + r.PrefixNote
	}
	return s
}

func listening(l httpapi.Listeners) string {
	s := l.Socket
	if l.TCP != "" {
		s += " · tcp " + l.TCP + " (tokens required)"
	}
	return s
}

// overview is labelled lines, the labels in a column.
type overview struct{ b strings.Builder }

func (o *overview) line(label, format string, args ...any) {
	fmt.Fprintf(&o.b, "%-13s%s\n", label, fmt.Sprintf(format, args...))
}

func (o *overview) String() string { return o.b.String() }

func nonEmpty(ss ...string) []string {
	var out []string
	for _, s := range ss {
		if s != "" && s != "()" {
			out = append(out, s)
		}
	}
	return out
}

func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

func times(n int) string {
	switch n {
	case 1:
		return "once"
	case 2:
		return "twice"
	}
	return fmt.Sprintf("%d times", n)
}

// bytesIEC is n bytes in KiB, MiB or GiB.
func bytesIEC(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit && exp < 3; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGT"[exp])
}
