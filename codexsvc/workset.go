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
//
// Its lock is held only to read or write the fields it guards, never
// across a search, a disk read or a token count: a question takes what it
// needs under the lock (observe), and a move's working set is chosen
// without it (choose) and committed under it (commit), if no other move
// came first. So one session moving the working set never holds up
// another's retrieval: that one answers from the working set as it was.
type workingSet struct {
	svc       *Service
	codex     *codex.Codex
	index     *sqlite.Index
	base      runcontext.Codex // the map alone, prerendered
	threshold int              // the CAG threshold: the stable blocks with the working set stay under it
	bound     codex.Bound      // the vocabulary's, if known
	posOnce   sync.Once
	pos       map[string]int // each file's place in the codex

	mu         sync.Mutex // guards the fields below; held only to read or write them
	baseTokens int        // the stable blocks with the map alone; 0 until counted
	cur        *wsChoice  // nil until the first question; never modified once made
	gen        int        // counts the moves: a move commits only onto the generation it was decided on
	misses     int
	moving     bool     // a move is being chosen: no other starts until it commits or fails
	recent     []string // the latest questions, newest last
}

// wsChoice is one working set. It is not modified once made, so it is
// read without the lock.
type wsChoice struct {
	block  runcontext.Codex
	whole  map[string]bool // paths held whole
	chunks map[string]bool // "path:lines" held
	files  int
	held   []string // the files' paths, sorted
	tokens int      // the stable blocks with it
}

// wsView is the working set one question answers from: a choice, its
// generation, and why it moved on this question, if it did.
type wsView struct {
	cur   *wsChoice
	gen   int
	moved string
}

// wsMove is a move decided under the lock, to be chosen without it: what
// it was decided on.
type wsMove struct {
	reason     string
	gen        int      // the generation it moves from
	recent     []string // the questions that choose it, a copy
	baseTokens int      // as known when it was decided; 0: not yet counted
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
	view, move := w.observe(query, top, learn)
	if move != nil {
		if view, err = w.move(ctx, move); err != nil {
			return runcontext.Codex{}, nil, ctxd.WorkingSet{}, err
		}
	}
	block, out, report := view.answer(w.base, top)
	return block, out, report, nil
}

// observe learns the question (if learn), counts whether its top hits
// drifted from the working set, and returns the working set as it is and,
// if the question moves it and no other move is being chosen, the move.
// It holds the lock only for that.
func (w *workingSet) observe(query string, top []sqlite.Hit, learn bool) (wsView, *wsMove) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if learn {
		w.recent = append(w.recent, query)
		w.recent = w.recent[max(0, len(w.recent)-recentQuestions):]
	}
	view := wsView{cur: w.cur, gen: w.gen}
	reason := w.drift(top, learn)
	if reason == "" || w.moving {
		// While another question's move is chosen, this one answers
		// from the working set as it is; that move's commit follows.
		return view, nil
	}
	w.moving = true
	return view, &wsMove{reason: reason, gen: w.gen, recent: slices.Clone(w.recent), baseTokens: w.baseTokens}
}

// drift says why the working set moves on a question with these top
// hits, or "" if it stays. The caller holds w.mu.
func (w *workingSet) drift(top []sqlite.Hit, learn bool) string {
	switch {
	case !learn, len(top) == 0:
		return ""
	case w.cur == nil:
		return "chosen for the first question"
	}
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
		return fmt.Sprintf("the questions drifted: %d in a row found under half of their top-%d excerpts in it", w.misses, len(top))
	}
	return ""
}

// move chooses the working set m was decided on, without the lock, and
// commits it. A move that panics is ended too (net/http recovers a
// handler's panic): the next may start.
func (w *workingSet) move(ctx context.Context, m *wsMove) (wsView, error) {
	defer func() {
		if r := recover(); r != nil {
			_, _ = w.commit(m, nil, 0, fmt.Errorf("codex working set: %v", r))
			panic(r)
		}
	}()
	choice, baseTokens, err := w.choose(ctx, m.recent, m.baseTokens)
	view, err := w.commit(m, choice, baseTokens, err)
	if err == nil && view.moved != "" {
		w.svc.log.Info("codex working set chosen", "generation", view.gen, "files", choice.files, "tokens", choice.tokens, "reason", view.moved)
	}
	return view, err
}

// commit ends move m: its choice becomes the working set if no other move
// came since m was decided (the generation is still m's); otherwise the
// working set that came first stays, whole, and this question answers
// from it. A move that failed changes nothing but the base count it made.
func (w *workingSet) commit(m *wsMove, choice *wsChoice, baseTokens int, err error) (wsView, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.moving = false
	if w.baseTokens == 0 {
		w.baseTokens = baseTokens
	}
	if err != nil {
		return wsView{}, err
	}
	if w.gen != m.gen {
		return wsView{cur: w.cur, gen: w.gen}, nil
	}
	w.cur, w.misses = choice, 0
	w.gen++
	return wsView{cur: choice, gen: w.gen, moved: m.reason}, nil
}

// answer is the codex block to render from this view of the working set,
// the top hits it does not hold, as excerpts, and its report.
func (v wsView) answer(base runcontext.Codex, top []sqlite.Hit) (runcontext.Codex, []ctxd.Excerpt, ctxd.WorkingSet) {
	report := ctxd.WorkingSet{Moved: v.moved, Generation: v.gen}
	block := base
	if v.cur != nil {
		block = v.cur.block
		report.Files, report.Tokens, report.Held = v.cur.files, v.cur.tokens, v.cur.held
	}
	var out []ctxd.Excerpt
	for _, h := range top {
		if v.cur.holds(h) {
			report.Hits++
			continue
		}
		out = append(out, h.Excerpt())
	}
	return block, out, report
}

// scoredChunk is a chunk a recent question found, with its weighted score.
type scoredChunk struct {
	chunk codex.Chunk
	score float64
}

// ranking is the codex's files in the order a working set takes them, with
// the chunks the recent questions found in each, best first, one per
// start line.
type ranking struct {
	files  []int
	chunks map[int][]scoredChunk
}

// choose picks the working set for the recent questions: files ranked by
// their chunks' scores and by their directory's best file, whole where they
// fit and their best chunks where not, until the stable blocks reach the
// CAG threshold. It reads, counts and searches without the lock, from what
// it is given: the questions, and the stable blocks' tokens with the map
// alone (0: it counts them, and returns them for the next move).
func (w *workingSet) choose(ctx context.Context, recent []string, baseTokens int) (*wsChoice, int, error) {
	if baseTokens == 0 {
		n, err := w.stableTokens(w.base)
		if err != nil {
			return nil, 0, err
		}
		baseTokens = n
	}
	perQuestion, err := w.candidates(ctx, recent)
	if err != nil {
		return nil, baseTokens, err
	}
	choice, err := w.fit(ctx, w.rank(perQuestion), w.threshold-baseTokens)
	return choice, baseTokens, err
}

// candidates are each recent question's best chunks, newest question
// first.
func (w *workingSet) candidates(ctx context.Context, recent []string) ([][]sqlite.Hit, error) {
	var perQuestion [][]sqlite.Hit
	for i := len(recent) - 1; i >= 0; i-- {
		hs, err := w.hits(ctx, recent[i], candidates)
		if err != nil {
			return nil, err
		}
		perQuestion = append(perQuestion, hs)
	}
	return perQuestion, nil
}

// rank orders the files the questions found: by their chunks' scores, the
// newer question weighing more (1, ½, ¼), then the other files of their
// directories at a share of its best file's score; ties in path order.
func (w *workingSet) rank(perQuestion [][]sqlite.Hit) ranking {
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
	w.linkDirectories(scores)
	r := ranking{files: make([]int, 0, len(scores)), chunks: chunks}
	for i := range scores {
		r.files = append(r.files, i)
	}
	slices.SortFunc(r.files, func(a, b int) int {
		if scores[a] != scores[b] {
			if scores[a] > scores[b] {
				return -1
			}
			return 1
		}
		return strings.Compare(w.codex.Files[a].Path, w.codex.Files[b].Path)
	})
	for i, cs := range chunks {
		chunks[i] = bestChunks(cs)
	}
	return r
}

// linkDirectories scores the files no question found beside those it did:
// a share of their directory's best file's score.
func (w *workingSet) linkDirectories(scores map[int]float64) {
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
}

// bestChunks orders a file's chunks best first (earlier lines first among
// equals) and keeps the best of those found more than once.
func bestChunks(cs []scoredChunk) []scoredChunk {
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
	out := cs[:0]
	for _, c := range cs {
		if !seen[c.chunk.Start] {
			seen[c.chunk.Start] = true
			out = append(out, c)
		}
	}
	return out
}

// fit picks the ranked files into budget and renders them, checked
// exactly. When the exact count overshoots the estimate, the budget
// shrinks by the overshoot and the files are picked again, so chunks can
// take the place of a whole file that did not fit after all; after three
// tries the lowest-ranked pieces are dropped while over the threshold.
func (w *workingSet) fit(ctx context.Context, r ranking, budget int) (*wsChoice, error) {
	pieces, err := w.pick(ctx, r, budget)
	if err != nil {
		return nil, err
	}
	for range 3 {
		choice, err := w.render(pieces)
		if err != nil {
			return nil, err
		}
		if choice.tokens <= w.threshold || len(pieces) == 0 {
			return choice, nil
		}
		budget -= choice.tokens - w.threshold
		if pieces, err = w.pick(ctx, r, budget); err != nil {
			return nil, err
		}
	}
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

// pick fills budget with the ranked files, in rank order: whole where they
// fit, their best chunks where not. Piece sizes are estimates
// (pieceOverhead).
func (w *workingSet) pick(ctx context.Context, r ranking, budget int) ([]codex.Piece, error) {
	var pieces []codex.Piece
	used := 0
	for _, i := range r.files {
		if budget-used < 64 {
			break
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		p, n, changed, err := w.wholeFile(i, budget-used)
		switch {
		case err != nil:
			return nil, err
		case changed:
			continue // the watcher's reload follows
		case n > 0:
			pieces = append(pieces, p)
			used += n
			continue
		}
		for _, c := range r.chunks[i] {
			m, err := w.svc.cfg.Tokenizer.CountText(c.chunk.Text)
			if err != nil {
				return nil, err
			}
			if used+m+pieceOverhead <= budget {
				pieces = append(pieces, codex.Piece{Path: w.codex.Files[i].Path, Lines: fmt.Sprintf("%d-%d", c.chunk.Start, c.chunk.End), Content: c.chunk.Text})
				used += m + pieceOverhead
			}
		}
	}
	return pieces, nil
}

// wholeFile is file i as one piece and its estimated tokens, if it fits in
// room; 0 tokens if it does not. A file whose bytes alone prove it too
// large is not read or counted; one changed since the load is not used at
// all (changed).
func (w *workingSet) wholeFile(i, room int) (p codex.Piece, tokens int, changed bool, err error) {
	f := w.codex.Files[i]
	if w.bound.Lower(f.Size) > int64(room-pieceOverhead) {
		return codex.Piece{}, 0, false, nil
	}
	content, err := w.codex.Content(i)
	if err != nil {
		w.svc.log.Debug("working set: file skipped", "path", f.Path, "err", err)
		return codex.Piece{}, 0, true, nil
	}
	n, err := w.svc.cfg.Tokenizer.CountText(content)
	if err != nil || n+pieceOverhead > room {
		return codex.Piece{}, 0, false, err
	}
	return codex.Piece{Path: f.Path, Content: content}, n + pieceOverhead, false, nil
}

// pieceOverhead is a generous count of a piece's fence lines in tokens;
// the whole block is counted exactly after.
const pieceOverhead = 24

// render builds the codex block of the map and pieces, and counts the
// stable blocks with it. The pieces are in the codex's order (the most
// stable files first, with codex.order = "stability"), a file's pieces by
// their lines.
func (w *workingSet) render(pieces []codex.Piece) (*wsChoice, error) {
	sorted := slices.Clone(pieces)
	pos := w.positions()
	slices.SortStableFunc(sorted, func(a, b codex.Piece) int {
		if a.Path != b.Path {
			return pos[a.Path] - pos[b.Path]
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
	for p := range files {
		choice.held = append(choice.held, p)
	}
	slices.Sort(choice.held)
	// The map, the working set, then the codex's totals (which change
	// with every edit: last, so an edit outside the working set costs
	// only them). The base block is the map and the totals.
	totals := w.codex.Totals()
	mapBody := strings.TrimSuffix(w.base.Body, "\n"+totals)
	block := runcontext.Codex{Name: w.base.Name, Mode: runcontext.ModeRAG, Files: w.base.Files,
		Body: mapBody + fmt.Sprintf("\nWorking set: %d files relevant to recent questions, whole or in part (lines), kept while the questions stay near them:\n", len(files)) +
			codex.RenderPieces(sorted) + "\n" + totals}
	block.Prerender(w.svc.cfg.Specials)
	n, err := w.stableTokens(block)
	if err != nil {
		return nil, err
	}
	choice.block, choice.tokens = block, n
	return choice, nil
}

// positions is each file's place in the codex.
func (w *workingSet) positions() map[string]int {
	w.posOnce.Do(func() {
		w.pos = make(map[string]int, len(w.codex.Files))
		for i, f := range w.codex.Files {
			w.pos[f.Path] = i
		}
	})
	return w.pos
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
