package orchestrator

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"log/slog"
	"path"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/karma"
	"github.com/ctxd/ctxd/runcontext"
	"github.com/ctxd/ctxd/sigils"
)

// KarmaConfig is how the karma block is chosen.
type KarmaConfig struct {
	Store   ctxd.KarmaStore // traces and snapshots; nil: no karma, no traces
	Options karma.Options   // selection; Now and Codex are set per choice
	Model   string          // the model name recorded with each trace
}

// karmaBook is the karma side of the orchestrator: it chooses each
// session's karma block from the karma store's traces, keeps each
// session's current snapshot (as stored) in memory, prunes a block the
// governor must shrink, and records answers as traces. Every store call
// is bounded by the store's deadline. Without a karma store it shows no
// karma and records no traces.
type karmaBook struct {
	cfg      KarmaConfig
	deadline storeDeadline
	now      func() time.Time
	log      *slog.Logger

	// shared: other daemons write the store too, so a held snapshot is
	// not read back (Config.SharedStore).
	shared bool

	mu        sync.Mutex                    // guards snapshots; held only to read or write it
	snapshots map[string]ctxd.KarmaSnapshot // each session's current karma snapshot, as stored
}

func newKarmaBook(cfg KarmaConfig, deadline storeDeadline, now func() time.Time, log *slog.Logger) *karmaBook {
	return &karmaBook{cfg: cfg, deadline: deadline, now: now, log: log, snapshots: map[string]ctxd.KarmaSnapshot{}}
}

// on reports whether there is a karma store: karma to show, traces to
// record.
func (k *karmaBook) on() bool { return k.cfg.Store != nil }

// Karma epoch reasons.
const (
	karmaNewSession = "first turn of the session"
	karmaRefresh    = "refresh asked by the request"
)

// choose returns the karma block for a request of sigil in session
// epoch epoch: the session's current snapshot while its karma epoch lasts,
// else (chosen) a new one from the sigil's eligible traces, which the
// caller stores once the request is ready to be sent (save). A karma
// epoch begins with the session (fresh: it has no turns, so a session
// deleted and begun again under its id starts afresh), with each session
// epoch (compaction, condensation, a client's edited history), with a
// change of sigil, and when a request asks for a refresh. An ephemeral ask
// gets a fresh choice, stored nowhere.
//
// A sigil without the karma:read scope is shown no karma.
func (k *karmaBook) choose(ctx context.Context, req ctxd.AskRequest, sigil runcontext.Sigil, epoch int, fresh, refresh bool, codex *codexState) (ctxd.KarmaSnapshot, bool, error) {
	if !k.on() || !sigils.Allows(sigil, sigils.ScopeKarmaRead) {
		return ctxd.KarmaSnapshot{Session: req.Session, Sigil: sigil.Name}, false, nil
	}
	var prev ctxd.KarmaSnapshot
	var had bool
	if !req.Ephemeral {
		var err error
		if prev, had, err = k.snapshot(ctx, req.Session); err != nil {
			return prev, false, err
		}
	}
	reason := ""
	switch {
	case !had || fresh:
		reason = karmaNewSession
	case refresh:
		reason = karmaRefresh
	case prev.Sigil != sigil.Name:
		reason = fmt.Sprintf("the session's sigil changed from %q to %q", prev.Sigil, sigil.Name)
	case prev.SessionEpoch != epoch:
		reason = fmt.Sprintf("the session entered epoch %d", epoch)
	default:
		return prev, false, nil
	}
	sctx, cancel := k.deadline.ctx(ctx, false)
	defer cancel()
	eligible, err := k.cfg.Store.Eligible(sctx, sigil.Name)
	if err != nil {
		return prev, false, k.deadline.err(sctx, req.Session, fmt.Sprintf("read the karma of sigil %q", sigil.Name), err)
	}
	codexFP := ""
	if codex != nil {
		codexFP = codex.fingerprint
	}
	// A trace whose code changed since it was verified is stale: it
	// leaves the block (kept in the record, valid until that change).
	if codexFP != "" {
		holding := eligible[:0:0]
		for _, t := range eligible {
			if why := karma.Stale(t, codexFP, codex.hashes()); why != "" {
				k.log.InfoContext(ctx, "karma trace left out", "session", req.Session, "trace", t.ID, "reason", "stale: "+why)
				continue
			}
			holding = append(holding, t)
		}
		eligible = holding
	}
	opts := k.cfg.Options
	opts.Now, opts.Codex = k.now(), codexFP
	entries, skipped := karma.Select(eligible, opts)
	for _, s := range skipped {
		k.log.InfoContext(ctx, "karma trace left out", "session", req.Session, "trace", s.Trace, "reason", s.Reason)
	}
	snap := ctxd.KarmaSnapshot{Session: req.Session, Sigil: sigil.Name, KarmaEpoch: prev.KarmaEpoch + 1,
		SessionEpoch: epoch, Reason: reason, Entries: entries, At: opts.Now}
	return snap, true, nil
}

// save stores a snapshot and keeps it as the session's current one.
func (k *karmaBook) save(ctx context.Context, snap ctxd.KarmaSnapshot) error {
	sctx, cancel := k.deadline.ctx(ctx, true)
	defer cancel()
	if err := k.cfg.Store.SaveKarmaSnapshot(sctx, snap); err != nil {
		if k.shared && ctxd.KindOf(err) == ctxd.KindConflict {
			// Another daemon answering the session at the same time
			// stored this epoch first: the record keeps its block, and
			// this answer is still recorded.
			k.log.Warn("another daemon stored this karma epoch first; the record keeps its block", "session", snap.Session, "karma_epoch", snap.KarmaEpoch)
			return nil
		}
		return k.deadline.err(sctx, snap.Session, fmt.Sprintf("store karma epoch %d", snap.KarmaEpoch), err)
	}
	if k.shared {
		return nil // nothing is read back from memory (Config.SharedStore)
	}
	k.mu.Lock()
	if len(k.snapshots) >= 1024 {
		clear(k.snapshots)
	}
	k.snapshots[snap.Session] = snap
	k.mu.Unlock()
	return nil
}

// snapshot is the session's current snapshot, from memory when this
// daemon chose or read it before.
func (k *karmaBook) snapshot(ctx context.Context, session string) (ctxd.KarmaSnapshot, bool, error) {
	k.mu.Lock()
	s, ok := k.snapshots[session]
	k.mu.Unlock()
	if ok && !k.shared {
		return s, true, nil
	}
	sctx, cancel := k.deadline.ctx(ctx, false)
	defer cancel()
	s, ok, err := k.cfg.Store.KarmaSnapshot(sctx, session)
	if err != nil {
		return s, false, k.deadline.err(sctx, session, "read its karma snapshot", err)
	}
	if ok && !k.shared {
		k.mu.Lock()
		k.snapshots[session] = s
		k.mu.Unlock()
	}
	return s, ok, nil
}

// forget drops what memory holds of a deleted session's karma. Its
// snapshots stay in the record; a session of this id begins a new karma
// epoch.
func (k *karmaBook) forget(session string) {
	k.mu.Lock()
	delete(k.snapshots, session)
	k.mu.Unlock()
}

// karmaBlock is a snapshot as the karma block holds it.
func karmaBlock(s ctxd.KarmaSnapshot) runcontext.Karma {
	k := runcontext.Karma{Epoch: s.KarmaEpoch}
	for _, e := range s.Entries {
		k.Entries = append(k.Entries, runcontext.KarmaEntry{ID: "k" + strconv.FormatInt(e.Trace, 10), Text: e.Text, Verbatim: e.Pinned})
	}
	return k
}

// karmaInfo is what the summary says of the karma block.
func karmaInfo(s ctxd.KarmaSnapshot, chosen bool) *ctxd.KarmaInfo {
	if s.KarmaEpoch == 0 {
		return nil
	}
	info := &ctxd.KarmaInfo{Epoch: s.KarmaEpoch, Traces: []int64{}}
	for _, e := range s.Entries {
		info.Traces = append(info.Traces, e.Trace)
	}
	if chosen {
		info.Began = s.Reason
	}
	return info
}

// prune leaves karma out of the snapshot to make a prompt fit: on
// its first call for a request, the lower-scoring half of the unpinned
// entries (room for the turns to come, so the block does not shrink again
// a turn later), then one entry a call. The pruned snapshot is a new
// karma epoch, or the one this request begins (pending). False when only
// pinned entries are left.
func (k *karmaBook) prune(snap *ctxd.KarmaSnapshot, pending, first bool, rc *runcontext.RunContext) (ctxd.Action, bool) {
	if !k.on() {
		return ctxd.Action{}, false
	}
	n := 1
	if first {
		unpinned := 0
		for _, e := range snap.Entries {
			if !e.Pinned {
				unpinned++
			}
		}
		n = max(1, (unpinned+1)/2)
	}
	entries := snap.Entries
	var dropped []string
	for range n {
		rest, d, ok := karma.DropLowest(entries)
		if !ok {
			break
		}
		entries = rest
		dropped = append(dropped, fmt.Sprintf("%d (score %.2f)", d.Trace, d.Score))
	}
	if len(dropped) == 0 {
		return ctxd.Action{}, false
	}
	reason := fmt.Sprintf("the governor left out karma trace(s) %s to fit the window", strings.Join(dropped, ", "))
	next := *snap
	next.Entries = entries
	if pending {
		next.Reason = snap.Reason + "; " + reason
	} else {
		next.KarmaEpoch, next.At, next.Reason = snap.KarmaEpoch+1, k.now(), reason
	}
	*snap = next
	rc.Karma = karmaBlock(next)
	return ctxd.Action{Kind: ctxd.ActionKarma, Reason: reason, Epoch: rc.State.Epoch}, true
}

// recordTrace records an answer as a trace; 0 when there is no karma
// store. The prompt's fingerprint covers its stable blocks (identity to
// karma): what the model was shown besides the conversation. A trace that
// is not recorded is an answer not recorded (KindNotRecorded).
func (k *karmaBook) recordTrace(ctx context.Context, req ctxd.AskRequest, rc *runcontext.RunContext, rendered runcontext.Rendered, answer string, codex *codexState, ws *ctxd.WorkingSet) (int64, error) {
	if !k.on() {
		return 0, nil
	}
	codexFP := ""
	var binding ctxd.TraceBinding
	if codex != nil {
		codexFP = codex.fingerprint
		binding = bindingOf(rc, answer, codex, ws)
	}
	h := sha256.New()
	for _, b := range rendered.Blocks[:runcontext.BlockState] {
		h.Write([]byte(b))
	}
	sctx, cancel := k.deadline.ctx(ctx, true)
	defer cancel()
	id, err := k.cfg.Store.RecordTrace(sctx, ctxd.Trace{
		Session: req.Session, Sigil: rc.Sigil.Name, Query: req.Query, Answer: answer, Model: k.cfg.Model,
		Fingerprint: hex.EncodeToString(h.Sum(nil)), Codex: codexFP, CreatedAt: k.now(), Binding: binding,
	})
	if err != nil {
		return 0, k.deadline.notRecorded(sctx, req.Session, "record the answer as a trace", fmt.Errorf("record the answer as a trace: %w", err))
	}
	return id, nil
}

// bindingOf is the code an answer holds for: the codex version, whole in
// CAG; in RAG the files the working set held and the excerpts the query
// carried; in both, the codex files the answer names (Cited), by path or,
// where no other file has it, by base name.
func bindingOf(rc *runcontext.RunContext, answer string, codex *codexState, ws *ctxd.WorkingSet) ctxd.TraceBinding {
	b := ctxd.TraceBinding{Codex: codex.fingerprint, Whole: rc.Codex.Mode == runcontext.ModeCAG}
	if codex.fingerprint == "" {
		return b
	}
	shas := codex.hashes()
	files := map[string]bool{} // path → cited
	if !b.Whole {
		if ws != nil {
			for _, p := range ws.Held {
				files[p] = false
			}
		}
		for _, e := range rc.Query.Excerpts {
			files[e.Path] = false
		}
	}
	for _, p := range cited(answer, rc.Codex.Files) {
		files[p] = true
	}
	for p, c := range files {
		if sum, ok := shas[p]; ok {
			b.Files = append(b.Files, ctxd.TraceFile{Path: p, SHA256: sum, Cited: c})
		}
	}
	slices.SortFunc(b.Files, func(x, y ctxd.TraceFile) int { return strings.Compare(x.Path, y.Path) })
	return b
}

// cited are the codex files answer names: by path, or by a base name no
// other file of the codex has (with an extension, so that a word is not
// taken for a file). The answer is read once, as a set of its names (runs
// of letters, digits and _-/. , trailing dots left off), whatever the
// codex's size.
func cited(answer string, files []runcontext.CodexRef) []string {
	names := map[string]bool{}
	for _, w := range strings.FieldsFunc(answer, func(r rune) bool { return r > 127 || !nameByte(byte(r)) && r != '.' }) {
		if w = strings.TrimRight(w, "."); w != "" {
			names[w] = true
		}
	}
	if len(names) == 0 {
		return nil
	}
	bases := map[string]int{}
	for _, f := range files {
		bases[path.Base(f.Path)]++
	}
	var out []string
	for _, f := range files {
		base := path.Base(f.Path)
		if names[f.Path] || bases[base] == 1 && strings.Contains(base, ".") && len(base) >= 4 && names[base] {
			out = append(out, f.Path)
		}
	}
	return out
}

// nameByte is a byte that continues a file name.
func nameByte(c byte) bool {
	return c == '_' || c == '-' || c == '/' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
}

// codexFingerprint identifies a codex's content (ctxd.CodexVersion of its
// files; "" for no codex).
func codexFingerprint(c runcontext.Codex) string {
	return ctxd.CodexVersion(codexFiles(c))
}

// codexFiles are a codex block's files as the domain names them.
func codexFiles(c runcontext.Codex) []ctxd.CodexFile {
	files := make([]ctxd.CodexFile, len(c.Files))
	for i, f := range c.Files {
		files[i] = ctxd.CodexFile{Path: f.Path, Bytes: f.Bytes, SHA256: f.SHA256}
	}
	return files
}
