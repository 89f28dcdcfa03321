package codexsvc

import (
	"context"
	"fmt"
	"path"
	"slices"
	"strings"
	"sync"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/codex"
	"github.com/ctxd/ctxd/runcontext"
	"github.com/ctxd/ctxd/sqlite"
)

// The working set of a codex too large to load whole (RAG): the codex
// block holds the tree's map and, after it, the files most relevant to the
// recent questions, whole where they fit and their most relevant chunks
// where not, filling the CAG budget. It is chosen at the first question
// and kept while the questions stay near it, so follow-up questions find
// their excerpts in the cached prefix; only excerpts from outside it join
// the query.
//
// One working set serves every session: the codex block is the common
// prefix of all of them, and a backend slot serves many sessions, so a
// working set per session would break every other session's prefix at the
// codex block each time sessions alternate. When it moves, every session's
// next prompt re-evaluates from the codex block on (the moving turn reports
// why; the others see a prefix break at the codex block).
const (
	// candidates is how many chunks a question retrieves to rank files by.
	candidates = 24
	// recentQuestions is how many of the latest questions choose the
	// working set (the newest weighs most: 1, ½, ¼).
	recentQuestions = 3
	// driftQuestions: the working set moves when this many questions in a
	// row found under half of their top-k excerpts in it. Moving costs a
	// re-evaluation of the whole block; staying, a few excerpts a question.
	driftQuestions = 3
	// linkShare is the share of a directory's best file score its other
	// files get: files beside a relevant one (a package) come next.
	linkShare = 0.25
)

// workingSet is the RAG retriever the request path uses: it implements
// ctxd.Retriever (the search_codex tool) and Retrieve.
type workingSet struct {
	svc       *Service
	codex     *codex.Codex
	index     *sqlite.Index
	base      runcontext.Codex // the map alone, prerendered
	threshold int              // the CAG threshold: the stable blocks with the working set stay under it
	bound     codex.Bound      // the vocabulary's, if known

	mu         sync.Mutex // guards the fields below; held while a working set is chosen
	baseTokens int        // the stable blocks with the map alone; 0 until counted
	cur        *wsChoice  // nil until the first question
	gen        int
	misses     int
	recent     []string // the latest questions, newest last
}

// wsChoice is one working set.
type wsChoice struct {
	block  runcontext.Codex
	whole  map[string]bool // paths held whole
	chunks map[string]bool // "path:lines" held
	files  int
	tokens int // the stable blocks with it
}

var _ ctxd.Retriever = (*workingSet)(nil)

func newWorkingSet(s *Service, c *codex.Codex, x *sqlite.Index, base runcontext.Codex, threshold int, recent []string) *workingSet {
	w := &workingSet{svc: s, codex: c, index: x, base: base, threshold: threshold, recent: recent}
	w.bound = s.bound()
	return w
}

// hits are the query's best chunks in this working set's codex. Right after
// a reload the index may already cut its hits from the next codex (whose
// file indexes differ): those are left out; the next codex's own working
// set takes over at once.
func (w *workingSet) hits(ctx context.Context, query string, n int) ([]sqlite.Hit, error) {
	hs, err := w.index.Hits(ctx, query, n)
	if err != nil {
		return nil, err
	}
	out := hs[:0]
	for _, h := range hs {
		if h.Codex == w.codex {
			out = append(out, h)
		}
	}
	return out, nil
}

// Search is the search_codex tool.
func (w *workingSet) Search(ctx context.Context, query string, k int) ([]ctxd.Excerpt, error) {
	return w.index.Search(ctx, query, k)
}

// holds reports whether the working set holds a hit.
func (c *wsChoice) holds(h sqlite.Hit) bool {
	if c == nil {
		return false
	}
	return c.whole[h.Path] || c.chunks[h.Path+":"+h.Excerpt().Lines]
}

// Retrieve returns the codex block to render for query (the map and the
// working set, which may move on this question), the query's top-k
// excerpts from outside the working set, and what the working set did.
func (w *workingSet) Retrieve(ctx context.Context, query string, k int) (runcontext.Codex, []ctxd.Excerpt, ctxd.WorkingSet, error) {
	return w.retrieve(ctx, query, k, true)
}

// Peek is Retrieve for a question outside any conversation (a door's
// text completion): the working set is read as it is; it neither learns
// the question nor moves, so such questions cannot change the codex block
// every session's prefix holds.
func (w *workingSet) Peek(ctx context.Context, query string, k int) (runcontext.Codex, []ctxd.Excerpt, ctxd.WorkingSet, error) {
	return w.retrieve(ctx, query, k, false)
}

// retrieve is Retrieve; learn says whether the question counts among the
// recent ones the working set follows.
func (w *workingSet) retrieve(ctx context.Context, query string, k int, learn bool) (runcontext.Codex, []ctxd.Excerpt, ctxd.WorkingSet, error) {
	// Only the top k: each hit's file is read and chunked again, and the
	// candidates a choice ranks are searched only when it is made.
	top, err := w.hits(ctx, query, k)
	if err != nil {
		return runcontext.Codex{}, nil, ctxd.WorkingSet{}, err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	var report ctxd.WorkingSet
	moved := ""
	if learn {
		w.recent = append(w.recent, query)
		w.recent = w.recent[max(0, len(w.recent)-recentQuestions):]
	}
	switch {
	case !learn, len(top) == 0:
	case w.cur == nil:
		moved = "chosen for the first question"
	default:
		in := 0
		for _, h := range top {
			if w.cur.holds(h) {
				in++
			}
		}
		if 2*in < len(top) {
			w.misses++
		} else {
			w.misses = 0
		}
		if w.misses >= driftQuestions {
			moved = fmt.Sprintf("the questions drifted: %d in a row found under half of their top-%d excerpts in it", w.misses, len(top))
		}
	}
	if moved != "" {
		choice, err := w.choose(ctx)
		if err != nil {
			return runcontext.Codex{}, nil, report, err
		}
		w.cur, w.misses = choice, 0
		w.gen++
		report.Moved = moved
		w.svc.log.Info("codex working set chosen", "generation", w.gen, "files", choice.files, "tokens", choice.tokens, "reason", moved)
	}
	block := w.base
	if w.cur != nil {
		block = w.cur.block
		report.Files, report.Tokens = w.cur.files, w.cur.tokens
	}
	report.Generation = w.gen
	var out []ctxd.Excerpt
	for _, h := range top {
		if w.cur.holds(h) {
			report.Hits++
			continue
		}
		out = append(out, h.Excerpt())
	}
	return block, out, report, nil
}

// scoredChunk is a chunk a recent question found, with its weighted score.
type scoredChunk struct {
	chunk codex.Chunk
	score float64
}

// choose picks the working set for the recent questions: files ranked by their chunks' scores and by their
// directory's best file, whole where they fit and their best chunks where
// not, until the stable blocks reach the CAG threshold. The caller holds
// w.mu.
func (w *workingSet) choose(ctx context.Context) (*wsChoice, error) {
	if w.baseTokens == 0 {
		n, err := w.stableTokens(w.base)
		if err != nil {
			return nil, err
		}
		w.baseTokens = n
	}
	var perQuestion [][]sqlite.Hit
	for i := len(w.recent) - 1; i >= 0; i-- { // newest first
		hs, err := w.hits(ctx, w.recent[i], candidates)
		if err != nil {
			return nil, err
		}
		perQuestion = append(perQuestion, hs)
	}
	scores := map[int]float64{}
	chunks := map[int][]scoredChunk{}
	weight := 1.0
	for _, hs := range perQuestion {
		for _, h := range hs {
			scores[h.File] += weight * h.Score
			chunks[h.File] = append(chunks[h.File], scoredChunk{h.Chunk, weight * h.Score})
		}
		weight /= 2
	}
	dirBest := map[string]float64{}
	for i, s := range scores {
		d := path.Dir(w.codex.Files[i].Path)
		dirBest[d] = max(dirBest[d], s)
	}
	for i, f := range w.codex.Files {
		if _, ok := scores[i]; !ok {
			if b, ok := dirBest[path.Dir(f.Path)]; ok {
				scores[i] = linkShare * b
			}
		}
	}
	ranked := make([]int, 0, len(scores))
	for i := range scores {
		ranked = append(ranked, i)
	}
	slices.SortFunc(ranked, func(a, b int) int {
		if scores[a] != scores[b] {
			if scores[a] > scores[b] {
				return -1
			}
			return 1
		}
		return strings.Compare(w.codex.Files[a].Path, w.codex.Files[b].Path)
	})
	// pick fills budget with the ranked files: whole where they fit, their
	// best chunks where not. Piece sizes are estimates (pieceOverhead).
	pick := func(budget int) ([]codex.Piece, error) {
		var pieces []codex.Piece
		used := 0
		for _, i := range ranked {
			if budget-used < 64 {
				break
			}
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			f := w.codex.Files[i]
			// A file whose bytes alone prove it too large is not read or
			// counted whole: its chunks are tried.
			if w.bound.Lower(f.Size) <= int64(budget-used-pieceOverhead) {
				content, err := w.codex.Content(i)
				if err != nil {
					// Changed since the load: the watcher's reload follows.
					w.svc.log.Debug("working set: file skipped", "path", f.Path, "err", err)
					continue
				}
				n, err := w.svc.cfg.Tokenizer.CountText(content)
				if err != nil {
					return nil, err
				}
				if used+n+pieceOverhead <= budget {
					pieces = append(pieces, codex.Piece{Path: f.Path, Content: content})
					used += n + pieceOverhead
					continue
				}
			}
			cs := chunks[i]
			slices.SortStableFunc(cs, func(a, b scoredChunk) int {
				switch {
				case a.score > b.score:
					return -1
				case a.score < b.score:
					return 1
				}
				return a.chunk.Start - b.chunk.Start
			})
			seen := map[int]bool{}
			for _, c := range cs {
				if seen[c.chunk.Start] {
					continue
				}
				seen[c.chunk.Start] = true
				m, err := w.svc.cfg.Tokenizer.CountText(c.chunk.Text)
				if err != nil {
					return nil, err
				}
				if used+m+pieceOverhead <= budget {
					pieces = append(pieces, codex.Piece{Path: f.Path, Lines: fmt.Sprintf("%d-%d", c.chunk.Start, c.chunk.End), Content: c.chunk.Text})
					used += m + pieceOverhead
				}
			}
		}
		return pieces, nil
	}
	budget := w.threshold - w.baseTokens
	pieces, err := pick(budget)
	if err != nil {
		return nil, err
	}
	// When the exact count overshoots the estimate, the budget shrinks by
	// the overshoot and the files are picked again, so chunks can take the
	// place of a whole file that did not fit after all.
	for range 3 {
		choice, err := w.render(pieces)
		if err != nil {
			return nil, err
		}
		if choice.tokens <= w.threshold || len(pieces) == 0 {
			return choice, nil
		}
		budget -= choice.tokens - w.threshold
		if pieces, err = pick(budget); err != nil {
			return nil, err
		}
	}
	// The pieces in path and line order, so the block's bytes depend on
	// what it holds, not on scores; then checked exactly, dropping the
	// lowest-ranked pieces while over the threshold.
	for {
		choice, err := w.render(pieces)
		if err != nil {
			return nil, err
		}
		if choice.tokens <= w.threshold || len(pieces) == 0 {
			return choice, nil
		}
		pieces = pieces[:len(pieces)-1]
	}
}

// pieceOverhead is a generous count of a piece's fence lines in tokens;
// the whole block is counted exactly after.
const pieceOverhead = 24

// render builds the codex block of the map and pieces, and counts the
// stable blocks with it.
func (w *workingSet) render(pieces []codex.Piece) (*wsChoice, error) {
	sorted := slices.Clone(pieces)
	slices.SortStableFunc(sorted, func(a, b codex.Piece) int {
		if c := strings.Compare(a.Path, b.Path); c != 0 {
			return c
		}
		return lineStart(a.Lines) - lineStart(b.Lines)
	})
	choice := &wsChoice{whole: map[string]bool{}, chunks: map[string]bool{}}
	files := map[string]bool{}
	for _, p := range sorted {
		files[p.Path] = true
		if p.Lines == "" {
			choice.whole[p.Path] = true
		} else {
			choice.chunks[p.Path+":"+p.Lines] = true
		}
	}
	choice.files = len(files)
	block := runcontext.Codex{Name: w.base.Name, Mode: runcontext.ModeRAG, Files: w.base.Files,
		Body: w.base.Body + fmt.Sprintf("\nWorking set: %d files relevant to recent questions, whole or in part (lines), kept while the questions stay near them:\n", len(files)) + codex.RenderPieces(sorted)}
	block.Prerender(w.svc.cfg.Specials)
	n, err := w.stableTokens(block)
	if err != nil {
		return nil, err
	}
	choice.block, choice.tokens = block, n
	return choice, nil
}

// stableTokens counts the stable blocks around a codex block.
func (w *workingSet) stableTokens(block runcontext.Codex) (int, error) {
	r, err := w.svc.cfg.Stable(block)
	if err != nil {
		return 0, ctxd.Errorf(ctxd.KindInternal, "codex: render the stable blocks: %w", err)
	}
	n, err := w.svc.cfg.Counter.Stable(r)
	if err != nil {
		return 0, ctxd.Errorf(ctxd.KindInternal, "codex: count the stable blocks: %w", err)
	}
	return n, nil
}

func lineStart(lines string) int {
	n := 0
	for _, c := range lines {
		if c < '0' || c > '9' {
			break
		}
		n = 10*n + int(c-'0')
	}
	return n
}

// recentQueries returns the latest questions, for the next codex's
// working set.
func (w *workingSet) recentQueries() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.recent)
}
