package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"sort"
	"strings"
	"time"
	"unicode/utf8"

	git "github.com/go-git/go-git/v5"
	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/object"

	"github.com/ctxd/ctxd/codex"
	"github.com/ctxd/ctxd/stability"
)

// The edits replay: what each commit of a real history costs the next
// question on a cached codex, in path order and in stability order.
//
// The codex at a commit is the tracked files below the codex's directory
// that a load keeps (text, valid UTF-8, at most 1 MiB), each rendered as
// the codex block renders it and counted with the model's tokenizer. A
// backend reuses its cache up to the first token that changed, so a
// commit costs the tokens from the first file not rendered as before to
// the end of the block, less that file's tokens before its first change
// when it is the same file, edited (costFrom). Path order puts added files in their place and
// keeps changed ones there; stability order is ranked once, from the
// history before the first commit replayed (the codex epoch), and then
// settled at each commit as the daemon's reloads settle it (a step of the
// weights, then stability.Settle: the files from the first changed one on
// arranged again, so what changed moves late).
//
// A third arm is backend.cache_reuse: the same stability order, but at
// each commit only the changed and new files move, to the end
// (stability.Last), and the backend shifts cached chunks past a change as
// llama-server's --cache-reuse does (shiftCost).

// EditsConfig is one history to replay.
type EditsConfig struct {
	Name    string // how the table names it
	Repo    string // a git work tree or bare repository
	Sub     string // the codex's directory below the repository's top ("": all of it)
	Commits int    // how many of the newest first-parent commits that touch the codex
	// ReuseChunk is the cache_reuse arm's smallest shifted chunk, in
	// tokens (0: DefaultReuseChunk).
	ReuseChunk int
	// Counter counts a rendered file's tokens.
	Counter codex.Counter
}

// EditsCommit is one commit's cost.
type EditsCommit struct {
	Hash         string `json:"hash"`
	Files        int    `json:"files_changed"` // codex files changed, added or removed
	CodexTokens  int    `json:"codex_tokens"`  // the whole codex block after it
	PathTokens   int    `json:"path_tokens"`   // re-evaluated in path order
	StableTokens int    `json:"stable_tokens"` // re-evaluated in stability order
	// HindsightTokens are re-evaluated in the best fixed order in
	// hindsight: Smith's rule on how often each file changes over the
	// replay itself, which no order learned from the past can know.
	HindsightTokens int `json:"hindsight_tokens"`
	// ReuseTokens are re-evaluated with backend.cache_reuse: the
	// changed files moved last, the files after the first change shifted.
	ReuseTokens int `json:"reuse_tokens"`
	Floor       int `json:"changed_tokens"` // the changed and added files' own tokens
	// Order is the stability order after the commit, and From the index
	// of its first file re-evaluated.
	Order []string `json:"-"`
	From  int      `json:"-"`
	// Cold says the commit changed a file that no commit of the last
	// coldCommits changed (or none since the epoch): no order learned from
	// the history can have put that file late.
	Cold bool `json:"cold"`
}

// DefaultReuseChunk is the replay's backend.cache_reuse when its config
// names none: the value docs/config.md suggests.
const DefaultReuseChunk = 64

// coldCommits is how many commits back a change makes a file warm.
const coldCommits = 20

// EditsRun is one replay.
type EditsRun struct {
	Name        string        `json:"name"`
	Epoch       string        `json:"epoch"`         // the commit the replay starts from
	EpochSource string        `json:"epoch_source"`  // what the stability order was ranked from
	StartFiles  int           `json:"start_files"`   // codex files at the epoch
	StartTokens int           `json:"start_tokens"`  // and their tokens
	Commits     []EditsCommit `json:"commits"`       // oldest first
	ReuseChunk  int           `json:"reuse_chunk"`   // the cache_reuse arm's smallest shifted chunk
	Took        float64       `json:"took_s"`        // the replay's wall time
	Skipped     int           `json:"files_skipped"` // files a load would leave out, at the epoch
}

// codexFile is a file of the replayed codex: its blob and its tokens.
type codexFile struct {
	blob   string
	size   int64
	tokens int
}

// sizesOf is the files' sizes in bytes, as a load knows them.
func sizesOf(files map[string]codexFile) map[string]int64 {
	out := make(map[string]int64, len(files))
	for p, f := range files {
		out[p] = f.size
	}
	return out
}

// ReplayEdits replays cfg's history.
func ReplayEdits(ctx context.Context, cfg EditsConfig) (EditsRun, error) {
	start := time.Now()
	if cfg.ReuseChunk <= 0 {
		cfg.ReuseChunk = DefaultReuseChunk
	}
	run := EditsRun{Name: cfg.Name, ReuseChunk: cfg.ReuseChunk}
	repo, err := git.PlainOpenWithOptions(cfg.Repo, &git.PlainOpenOptions{DetectDotGit: true})
	if errors.Is(err, git.ErrRepositoryNotExists) {
		repo, err = git.PlainOpen(cfg.Repo) // a bare repository
	}
	if err != nil {
		return run, fmt.Errorf("edits: open %s: %w", cfg.Repo, err)
	}
	prefix := strings.Trim(cfg.Sub, "/")
	if prefix != "" {
		prefix += "/"
	}
	head, err := repo.Head()
	if err != nil {
		return run, fmt.Errorf("edits: %s: HEAD: %w", cfg.Repo, err)
	}
	c, err := repo.CommitObject(head.Hash())
	if err != nil {
		return run, fmt.Errorf("edits: %w", err)
	}
	// The newest first-parent commits that touch the codex, newest first.
	var line []*object.Commit
	for c != nil && len(line) < cfg.Commits {
		if err := ctx.Err(); err != nil {
			return run, err
		}
		parent, err := c.Parent(0)
		if err != nil {
			break // the first commit, or a shallow end: no diff to replay
		}
		touched, err := touches(ctx, parent, c, prefix)
		if err != nil {
			return run, err
		}
		if touched {
			line = append(line, c)
		}
		c = parent
	}
	if len(line) == 0 {
		return run, fmt.Errorf("edits: %s: no commit touches %q", cfg.Repo, cfg.Sub)
	}
	slices.Reverse(line)
	epoch, err := line[0].Parent(0)
	if err != nil {
		return run, err
	}
	run.Epoch = epoch.Hash.String()
	counts := map[string]int{} // by blob hash
	files, skipped, err := codexAt(ctx, epoch, prefix, cfg.Counter, counts)
	if err != nil {
		return run, err
	}
	run.Skipped = skipped
	paths := sortedPaths(files)
	run.StartFiles = len(paths)
	for _, f := range files {
		run.StartTokens += f.tokens
	}
	rk, err := stability.History(ctx, epoch, prefix, paths, stability.Options{Budget: time.Minute})
	if err != nil {
		return run, err
	}
	run.EpochSource = rk.Describe()
	weights := rk.Weights()
	stable := rk.Order(paths, sizesOf(files))
	pathOrder, last := paths, stable
	lastChange := map[string]int{} // commit index of each file's last change in the replay
	// Every version first: the hindsight order needs the changes to come.
	versions := make([]map[string]codexFile, len(line))
	for i, commit := range line {
		if versions[i], _, err = codexAt(ctx, commit, prefix, cfg.Counter, counts); err != nil {
			return run, err
		}
	}
	hindsight := hindsightRank(files, versions)
	for i, commit := range line {
		next := versions[i]
		changed := map[string]bool{}
		for p, f := range next {
			if old, ok := files[p]; !ok || old.blob != f.blob {
				changed[p] = true
			}
		}
		removed := 0
		for p := range files {
			if _, ok := next[p]; !ok {
				removed++
			}
		}
		nextPaths := sortedPaths(next)
		pathFrom := stability.From(pathOrder, nextPaths, changed)
		// As a reload does (codex.Load): one step of the weights, then
		// the order settled.
		weights.Step(changed, 0)
		order, stableFrom := stability.Settle(stable, nextPaths, changed, sizesOf(next), weights)
		lastOrder, _ := stability.Last(last, nextPaths, changed, sizesOf(next), weights)
		pathCost, err := costFrom(repo, cfg.Counter, pathOrder, nextPaths, pathFrom, files, next)
		if err != nil {
			return run, err
		}
		stableCost, err := costFrom(repo, cfg.Counter, stable, order, stableFrom, files, next)
		if err != nil {
			return run, err
		}
		prevHS, nextHS := hindsight.order(files), hindsight.order(next)
		hindsightCost, err := costFrom(repo, cfg.Counter, prevHS, nextHS, stability.From(prevHS, nextHS, changed), files, next)
		if err != nil {
			return run, err
		}
		reuseCost, err := shiftCost(last, lastOrder, changed, next, cfg.ReuseChunk, func(p string) (int, error) {
			return sharedHead(repo, cfg.Counter, p, files, next)
		})
		if err != nil {
			return run, err
		}
		cost := EditsCommit{Hash: commit.Hash.String(), Files: len(changed) + removed, Order: order, From: stableFrom,
			PathTokens: pathCost, StableTokens: stableCost, ReuseTokens: reuseCost, HindsightTokens: hindsightCost}
		for _, f := range next {
			cost.CodexTokens += f.tokens
		}
		for p := range changed {
			cost.Floor += next[p].tokens
			if _, existed := files[p]; existed {
				if at, ok := lastChange[p]; !ok || i-at > coldCommits {
					cost.Cold = true
				}
			}
			lastChange[p] = i
		}
		run.Commits = append(run.Commits, cost)
		files, pathOrder, stable, last = next, nextPaths, order, lastOrder
	}
	run.Took = time.Since(start).Seconds()
	return run, nil
}

// touches reports whether the commit changed a file below prefix.
func touches(ctx context.Context, parent, c *object.Commit, prefix string) (bool, error) {
	pt, err := parent.Tree()
	if err != nil {
		return false, err
	}
	ct, err := c.Tree()
	if err != nil {
		return false, err
	}
	changes, err := object.DiffTreeWithOptions(ctx, pt, ct, nil)
	if err != nil {
		return false, err
	}
	for _, ch := range changes {
		if strings.HasPrefix(ch.From.Name, prefix) && ch.From.Name != "" || strings.HasPrefix(ch.To.Name, prefix) && ch.To.Name != "" {
			return true, nil
		}
	}
	return false, nil
}

// maxReplayFileBytes is a load's default per-file cap.
const maxReplayFileBytes = 1 << 20

// codexAt is the codex at commit c: its files below prefix that a load
// keeps (paths relative to prefix), with their tokens as the codex block
// renders them (counted once per blob, in counts), and how many it leaves
// out.
func codexAt(ctx context.Context, c *object.Commit, prefix string, counter codex.Counter, counts map[string]int) (map[string]codexFile, int, error) {
	tree, err := c.Tree()
	if err != nil {
		return nil, 0, err
	}
	files := map[string]codexFile{}
	skipped := 0
	err = tree.Files().ForEach(func(f *object.File) error {
		if err := ctx.Err(); err != nil {
			return err
		}
		if !strings.HasPrefix(f.Name, prefix) || !f.Mode.IsFile() {
			return nil
		}
		rel := strings.TrimPrefix(f.Name, prefix)
		if _, secret := codex.SecretFile(rel); secret {
			skipped++
			return nil
		}
		hash := f.Hash.String()
		if n, ok := counts[hash]; ok {
			if n >= 0 {
				files[rel] = codexFile{blob: hash, size: f.Size, tokens: n}
			} else {
				skipped++
			}
			return nil
		}
		n := -1
		if f.Size <= maxReplayFileBytes {
			r, err := f.Reader()
			if err != nil {
				return err
			}
			data, err := io.ReadAll(r)
			r.Close()
			if err != nil {
				return err
			}
			if utf8.Valid(data) && !bytes.Contains(data, []byte{0}) {
				text := codex.RenderPieces([]codex.Piece{{Path: rel, Content: string(data)}})
				if n, err = counter.CountText(text); err != nil {
					return err
				}
			}
		}
		counts[hash] = n
		if n < 0 {
			skipped++
			return nil
		}
		files[rel] = codexFile{blob: hash, size: f.Size, tokens: n}
		return nil
	})
	return files, skipped, err
}

func sortedPaths(files map[string]codexFile) []string {
	out := make([]string, 0, len(files))
	for p := range files {
		out = append(out, p)
	}
	sort.Strings(out)
	return out
}

// costFrom is what a backend re-evaluates when the codex rendered in prev
// order (prevFiles) is followed by next order (nextFiles), whose first
// file not rendered as before is at index i: from the first changed token
// on. When the file at i is the one that was there, edited, the tokens of
// its rendering before the first changed byte are still cached (less one,
// for a token that may merge across the cut).
func costFrom(repo *git.Repository, counter codex.Counter, prev, next []string, i int, prevFiles, nextFiles map[string]codexFile) (int, error) {
	n := tokensFrom(next, i, nextFiles)
	if i >= len(next) || i >= len(prev) || prev[i] != next[i] {
		return n, nil
	}
	kept, err := sharedHead(repo, counter, next[i], prevFiles, nextFiles)
	if err != nil {
		return 0, err
	}
	return n - max(0, kept-1), nil
}

// sharedHead is the tokens that the renderings of file p before
// (prevFiles) and after (nextFiles) share from their start.
func sharedHead(repo *git.Repository, counter codex.Counter, p string, prevFiles, nextFiles map[string]codexFile) (int, error) {
	before, err := blobText(repo, prevFiles[p].blob)
	if err != nil {
		return 0, err
	}
	after, err := blobText(repo, nextFiles[p].blob)
	if err != nil {
		return 0, err
	}
	a := codex.RenderPieces([]codex.Piece{{Path: p, Content: before}})
	b := codex.RenderPieces([]codex.Piece{{Path: p, Content: after}})
	same := 0
	for same < len(a) && same < len(b) && a[same] == b[same] {
		same++
	}
	for same > 0 && !utf8.RuneStart(b[same]) {
		same-- // cut on a character
	}
	return counter.CountText(b[:same])
}

// hindsightOrder ranks every file the replay sees by Smith's rule
// (stability.Arrange) on the number of the replay's commits that change
// it, its size its largest: the best fixed order for these commits, known
// only after them.
type hindsightOrder map[string]int

func hindsightRank(epoch map[string]codexFile, versions []map[string]codexFile) hindsightOrder {
	changes := stability.Weights{}
	sizes := map[string]int64{}
	for p, f := range epoch {
		sizes[p] = f.size
	}
	prev := epoch
	for _, v := range versions {
		for p, f := range v {
			if old, ok := prev[p]; !ok || old.blob != f.blob {
				changes[p]++
			}
			sizes[p] = max(sizes[p], f.size)
		}
		prev = v
	}
	paths := make([]string, 0, len(sizes))
	for p := range sizes {
		paths = append(paths, p)
	}
	stability.Arrange(paths, sizes, changes)
	rank := make(hindsightOrder, len(paths))
	for i, p := range paths {
		rank[p] = i
	}
	return rank
}

// order is the files of a version in the hindsight order.
func (h hindsightOrder) order(files map[string]codexFile) []string {
	out := make([]string, 0, len(files))
	for p := range files {
		out = append(out, p)
	}
	slices.SortFunc(out, func(a, b string) int { return h[a] - h[b] })
	return out
}

// shiftCost is what a backend that shifts cached chunks past a change
// (llama-server's --cache-reuse minChunk) evaluates when its slot holds
// the codex rendered in prev order and the prompt renders it in next
// order, walked as llama-server walks them: after the common prefix, it
// looks ahead in the cache for the prompt's next tokens, and shifts each
// run it finds of at least minChunk tokens; where it finds none (a file
// changed or moved before the ones it passed) the walk ends, and
// everything from there is evaluated. Whole files here, but for a file
// edited where the cache has its old version next: head(path) is the
// tokens its old and new renderings share from their start, which the
// walk takes with the run before them (the live test allows for the
// tokens that merge across a fence).
func shiftCost(prev, next []string, changed map[string]bool, files map[string]codexFile, minChunk int, head func(string) (int, error)) (int, error) {
	same := func(c, p int) bool { return prev[c] == next[p] && !changed[next[p]] }
	c, p, first := 0, 0, true
	for c < len(prev) && p < len(next) {
		n, tokens := 0, 0
		for c+n < len(prev) && p+n < len(next) && same(c+n, p+n) {
			tokens += files[next[p+n]].tokens
			n++
		}
		kept := 0
		if c+n < len(prev) && p+n < len(next) && prev[c+n] == next[p+n] { // that file, edited
			h, err := head(next[p+n])
			if err != nil {
				return 0, err
			}
			kept = max(0, h-1) // less one, for a token that may merge across the cut
		}
		// The common prefix needs no minimum; a shifted run does.
		if first || tokens+kept >= minChunk {
			if kept > 0 {
				return tokensFrom(next, p+n, files) - kept, nil // the walk ends inside the edited file
			}
			c, p, first = c+n, p+n, false
			continue
		}
		c++
	}
	return tokensFrom(next, p, files), nil
}

// blobText is a blob's content.
func blobText(repo *git.Repository, hash string) (string, error) {
	b, err := repo.BlobObject(plumbing.NewHash(hash))
	if err != nil {
		return "", err
	}
	r, err := b.Reader()
	if err != nil {
		return "", err
	}
	defer r.Close()
	data, err := io.ReadAll(r)
	return string(data), err
}

// tokensFrom is the tokens of order's files from index i to the end.
func tokensFrom(order []string, i int, files map[string]codexFile) int {
	n := 0
	for _, p := range order[min(i, len(order)):] {
		n += files[p].tokens
	}
	return n
}

// EditsSummary is a replay's medians and 90th percentiles.
type EditsSummary struct {
	Commits                      int
	PathMedian, StableMedian     float64
	PathP90, StableP90           float64
	PathMean, StableMean         float64
	ReuseMedian, ReuseP90        float64 // backend.cache_reuse
	ReuseMean                    float64
	HindsightMedian              float64 // the best fixed order in hindsight
	CodexMedian                  float64
	StableNotWorse, StableBetter int
	FloorMedian                  float64
	Cold                         int // commits that changed a cold file
}

// Summarize is run's summary.
func (run EditsRun) Summarize() EditsSummary {
	var path, stable, reuse, hindsight, whole, floor []float64
	s := EditsSummary{Commits: len(run.Commits)}
	for _, c := range run.Commits {
		path = append(path, float64(c.PathTokens))
		hindsight = append(hindsight, float64(c.HindsightTokens))
		reuse = append(reuse, float64(c.ReuseTokens))
		stable = append(stable, float64(c.StableTokens))
		whole = append(whole, float64(c.CodexTokens))
		floor = append(floor, float64(c.Floor))
		if c.Cold {
			s.Cold++
		}
		if c.StableTokens <= c.PathTokens {
			s.StableNotWorse++
		}
		if c.StableTokens < c.PathTokens {
			s.StableBetter++
		}
	}
	s.PathMedian, s.StableMedian = percentile(path, 0.5), percentile(stable, 0.5)
	s.PathP90, s.StableP90 = percentile(path, 0.9), percentile(stable, 0.9)
	s.PathMean, s.StableMean = mean(path), mean(stable)
	s.ReuseMedian, s.ReuseP90, s.ReuseMean = percentile(reuse, 0.5), percentile(reuse, 0.9), mean(reuse)
	s.HindsightMedian = percentile(hindsight, 0.5)
	s.CodexMedian = percentile(whole, 0.5)
	s.FloorMedian = percentile(floor, 0.5)
	return s
}

func mean(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	t := 0.0
	for _, x := range xs {
		t += x
	}
	return t / float64(len(xs))
}

// EditsTable is the replays as the docs show them.
func EditsTable(runs []EditsRun) string {
	var sb strings.Builder
	sb.WriteString("| history | commits replayed | codex at the epoch | codex tokens (median) | re-evaluated, path order: median / p90 / mean | stability order: median / p90 / mean | median, stability ÷ path | the changed files alone (median) | commits that changed a cold file | commits where stability order cost less / the same or less |\n")
	sb.WriteString("|---|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range runs {
		s := r.Summarize()
		ratio := "—"
		if s.PathMedian > 0 {
			ratio = fmt.Sprintf("%.2f", s.StableMedian/s.PathMedian)
		}
		fmt.Fprintf(&sb, "| %s | %d | %d files, %s tokens | %s | %s / %s / %s | %s / %s / %s | %s | %s | %d%% | %d / %d |\n",
			r.Name, s.Commits, r.StartFiles, thousands(r.StartTokens), thousands(int(s.CodexMedian)),
			thousands(int(s.PathMedian)), thousands(int(s.PathP90)), thousands(int(s.PathMean)),
			thousands(int(s.StableMedian)), thousands(int(s.StableP90)), thousands(int(s.StableMean)),
			ratio, thousands(int(s.FloorMedian)), 100*s.Cold/max(1, s.Commits), s.StableBetter, s.StableNotWorse)
	}
	return sb.String()
}

// EditsNotes are a line per replay: its epoch, what ranked its stability
// order, the files a load leaves out, and what the best fixed order in
// hindsight would cost.
func EditsNotes(runs []EditsRun) string {
	var sb strings.Builder
	for _, r := range runs {
		s := r.Summarize()
		fmt.Fprintf(&sb, "- %s: epoch %s, stability order ranked from %s; %d files a load leaves out (binary, over 1 MiB, secret files). The best fixed order in hindsight (Smith's rule on how often each file changes in these %d commits, which no order learned from the past can know) would re-evaluate a median of %s tokens, %.2f of path order's.\n",
			r.Name, r.Epoch[:min(12, len(r.Epoch))], r.EpochSource, r.Skipped, s.Commits, thousands(int(s.HindsightMedian)), s.HindsightMedian/max(1, s.PathMedian))
	}
	return sb.String()
}

// EditsReuseTable is the backend.cache_reuse arm of the replays: the
// changed files moved to the end, the files after the first change
// shifted by the backend instead of evaluated.
func EditsReuseTable(runs []EditsRun) string {
	var sb strings.Builder
	sb.WriteString("| history | smallest shifted chunk | re-evaluated with cache_reuse: median / p90 / mean | median ÷ path order's | median ÷ stability order's | the changed files alone (median) |\n")
	sb.WriteString("|---|---|---|---|---|---|\n")
	ratio := func(a, b float64) string {
		if b <= 0 {
			return "—"
		}
		return fmt.Sprintf("%.2f", a/b)
	}
	for _, r := range runs {
		s := r.Summarize()
		fmt.Fprintf(&sb, "| %s | %d tokens | %s / %s / %s | %s | %s | %s |\n", r.Name, r.ReuseChunk,
			thousands(int(s.ReuseMedian)), thousands(int(s.ReuseP90)), thousands(int(s.ReuseMean)),
			ratio(s.ReuseMedian, s.PathMedian), ratio(s.ReuseMedian, s.StableMedian), thousands(int(s.FloorMedian)))
	}
	return sb.String()
}

// WriteBetween rewrites what stands between the begin and end markers in
// the file at path, through a temporary file renamed over it.
func WriteBetween(path, begin, end, body string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	text := string(data)
	i, j := strings.Index(text, begin), strings.Index(text, end)
	if i < 0 || j < i {
		return fmt.Errorf("bench: %s has no section between %s and %s", path, begin, end)
	}
	text = text[:i+len(begin)] + "\n" + strings.TrimSpace(body) + "\n" + text[j:]
	tmp := path + ".tmp-section"
	if err := os.WriteFile(tmp, []byte(text), 0o644); err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	return os.Rename(tmp, path)
}
