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
// questions, whole where they fit and their most relevant chunks where
// not. It is chosen at the first question, filling its room (the CAG
// budget less the map), so follow-up questions find their excerpts in
// the cached prefix; a question's excerpts from outside it join the query
// (and the conversation's history). It changes only at the conversation's
// epochs: when the governor drops the history's excerpts to make a
// request fit, everything after the codex block is evaluated again
// anyway, and the working set keeps the most relevant of those excerpts
// at its end (Absorb), where the block before them stays the same bytes.
// When its room is full, it first drops pieces from its end, as few as
// make room: the drop that keeps the longest prefix. A reload (an edit)
// renders it from the same pieces read again, so the block changes from
// the first edited piece on.
//
// One working set serves every session: the codex block is the common
// prefix of all of them, and a backend slot serves many sessions, so a
// working set per session would break every other session's prefix at the
// codex block each time sessions alternate. When it grows, every session's
// next prompt re-evaluates from the new pieces on (the growing turn
// reports why; the others see a prefix break at the codex block).
const (
	// candidates is how many chunks a question retrieves to rank files by.
	candidates = 24
	// recentQuestions is how many of the latest questions choose the
	// first working set (the newest weighs most: 1, ½, ¼).
	recentQuestions = 3
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
// without it (choose, grow, carry) and committed under it (commit), if no
// other move came first. So one session moving the working set never
// holds up another's retrieval: that one answers from the working set as
// it was.
type workingSet struct {
	svc       *Service
	codex     *codex.Codex
	index     *sqlite.Index
	base      runcontext.Codex // the map alone, prerendered
	threshold int              // the CAG threshold: the stable blocks with the working set stay under it
	bound     codex.Bound      // the vocabulary's, if known
	posOnce   sync.Once
	pos       map[string]int // each file's place in the codex
	carried   []codex.Piece  // the working set of the codex before the reload, to read again at the first question; nil if none

	mu         sync.Mutex // guards the fields below; held only to read or write them
	baseTokens int        // the stable blocks with the map alone; 0 until counted
	cur        *wsChoice  // nil until the first question; never modified once made
	gen        int        // counts the moves: a move commits only onto the generation it was decided on
	moving     bool       // a move is being chosen: no other starts until it commits or fails
	recent     []string   // the latest questions, newest last
}

// wsChoice is one working set. It is not modified once made, so it is
// read without the lock.
type wsChoice struct {
	block    runcontext.Codex
	pieces   []codex.Piece // in the block's order
	*holding               // what the pieces hold
	held     []string      // the files' paths, sorted
	tokens   int           // the stable blocks with it
}

// wsView is the working set one question answers from: a choice, its
// generation, and why it moved on this question, if it did.
type wsView struct {
	cur   *wsChoice
	gen   int
	moved string
	added int // pieces the move added at the end
	dropd int // pieces it dropped from the end first
}

// Kinds of move.
const (
	moveChoose = iota // the first working set, from the recent questions
	moveGrow          // pieces added at the end at an epoch (Absorb)
	moveCarry         // the working set of the codex before a reload, read again
)

// wsMove is a move decided under the lock, to be chosen without it: what
// it was decided on.
type wsMove struct {
	kind       int
	reason     string
	gen        int           // the generation it moves from
	cur        *wsChoice     // the working set it grows
	want       []codex.Piece // the pieces it grows by, the most wanted first
	budget     int           // their tokens at most
	recent     []string      // the questions that choose it, a copy
	baseTokens int           // as known when it was decided; 0: not yet counted
}

var _ ctxd.Retriever = (*workingSet)(nil)

// newWorkingSet is c's working set; carried is the working set of the
// codex before (its pieces, read again from c at the first question), and
// recent its questions.
func newWorkingSet(s *Service, c *codex.Codex, x *sqlite.Index, base runcontext.Codex, threshold int, recent []string, carried []codex.Piece) *workingSet {
	w := &workingSet{svc: s, codex: c, index: x, base: base, threshold: threshold, recent: recent, carried: carried}
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
	return c.has(h.Path, h.Excerpt().Lines)
}

// Retrieve returns the codex block to render for query (the map and the
// working set, chosen or carried over at the first question), the query's top-k
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

// observe learns the question (if learn), sees whether its top hits
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
	kind, reason := w.drift(top, learn)
	if reason == "" || w.moving {
		// While another question's move is chosen, this one answers
		// from the working set as it is; that move's commit follows.
		return view, nil
	}
	w.moving = true
	return view, &wsMove{kind: kind, reason: reason, gen: w.gen, recent: slices.Clone(w.recent), baseTokens: w.baseTokens}
}

// drift says how and why the working set moves on a question with these
// top hits, or "" if it stays: it is chosen (or carried over from the
// codex before) at the first question, and otherwise stays: a question
// elsewhere finds its excerpts in the query, and the working set grows
// only at the conversation's epochs (Absorb). The caller holds w.mu.
func (w *workingSet) drift(top []sqlite.Hit, learn bool) (int, string) {
	switch {
	case !learn, len(top) == 0, w.cur != nil:
		return 0, ""
	case len(w.carried) > 0:
		return moveCarry, "kept from the codex before the reload, its pieces read again"
	}
	return moveChoose, "chosen for the first question"
}

// wsResult is what a move chose: the working set (nil if it failed; the
// one it started from if it changed nothing), the base count it made, and
// the pieces it added at the end and dropped from the end first.
type wsResult struct {
	choice         *wsChoice
	baseTokens     int
	added, dropped int
}

// move chooses the working set m was decided on, without the lock, and
// commits it. A move that panics is ended too (net/http recovers a
// handler's panic): the next may start.
func (w *workingSet) move(ctx context.Context, m *wsMove) (wsView, error) {
	defer func() {
		if r := recover(); r != nil {
			_, _ = w.commit(m, wsResult{}, fmt.Errorf("codex working set: %v", r))
			panic(r)
		}
	}()
	res, err := w.choose(ctx, m)
	view, err := w.commit(m, res, err)
	if err == nil && view.moved != "" {
		w.svc.log.Info("codex working set moved", "generation", view.gen, "files", len(res.choice.held), "tokens", res.choice.tokens,
			"added", res.added, "dropped", res.dropped, "reason", view.moved)
	}
	return view, err
}

// choose makes move m's working set. It reads, counts and searches
// without the lock, from what m holds.
func (w *workingSet) choose(ctx context.Context, m *wsMove) (wsResult, error) {
	res := wsResult{baseTokens: m.baseTokens}
	if res.baseTokens == 0 {
		n, err := w.stableTokens(w.base)
		if err != nil {
			return res, err
		}
		res.baseTokens = n
	}
	room := w.threshold - res.baseTokens
	var err error
	switch m.kind {
	case moveGrow:
		res.choice, res.added, res.dropped, err = w.grow(ctx, m.cur, m.want, m.budget)
		return res, err
	case moveCarry:
		if res.choice, err = w.carry(ctx); err != nil {
			return res, err
		}
		if res.choice != nil {
			res.added = len(res.choice.pieces)
			return res, nil
		}
		m.reason = "chosen for the first question" // nothing of the codex before is left
	}
	perQuestion, err := w.candidates(ctx, m.recent)
	if err != nil {
		return res, err
	}
	res.choice, err = w.first(ctx, w.rank(perQuestion, true), room)
	if res.choice != nil {
		res.added = len(res.choice.pieces)
	}
	return res, err
}

// commit ends move m: its choice becomes the working set if no other move
// came since m was decided (the generation is still m's) and it changed
// anything; otherwise the working set there is stays, whole, and this
// question answers from it. A move that failed changes nothing but the
// base count it made.
func (w *workingSet) commit(m *wsMove, res wsResult, err error) (wsView, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.moving = false
	if w.baseTokens == 0 {
		w.baseTokens = res.baseTokens
	}
	if err != nil {
		return wsView{}, err
	}
	if w.gen != m.gen || res.choice == nil || res.choice == w.cur {
		return wsView{cur: w.cur, gen: w.gen}, nil
	}
	w.cur = res.choice
	w.gen++
	reason := m.reason
	if m.kind == moveGrow {
		reason = fmt.Sprintf("grew at its end by %d pieces, %s", res.added, m.reason)
		if res.dropped > 0 {
			reason += fmt.Sprintf("; its room was full, so it first dropped its last %d pieces (the drop that keeps the longest prefix)", res.dropped)
		}
	}
	return wsView{cur: res.choice, gen: w.gen, moved: reason, added: res.added, dropd: res.dropped}, nil
}

// answer is the codex block to render from this view of the working set,
// the top hits it does not hold, as excerpts, and its report.
func (v wsView) answer(base runcontext.Codex, top []sqlite.Hit) (runcontext.Codex, []ctxd.Excerpt, ctxd.WorkingSet) {
	report := ctxd.WorkingSet{Moved: v.moved, Generation: v.gen, Added: v.added, Dropped: v.dropd}
	block := base
	if v.cur != nil {
		block = v.cur.block
		report.Files, report.Tokens, report.Held = len(v.cur.held), v.cur.tokens, v.cur.held
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

// grow adds want at the end of cur, in their order, leaving out what cur
// holds, while they fit in budget tokens. When less than that is left
// under the threshold, it first drops pieces from the end, as few as make
// room (the drop that keeps the longest prefix), and then takes back, in
// their order, those the growth left room for. It returns cur itself when
// it adds nothing.
func (w *workingSet) grow(ctx context.Context, cur *wsChoice, want []codex.Piece, budget int) (*wsChoice, int, int, error) {
	// Pieces' estimated sizes, each counted once, when first needed.
	sizer := func(pieces []codex.Piece) func(int) (int, error) {
		sizes := make([]int, len(pieces))
		return func(i int) (int, error) {
			if sizes[i] == 0 {
				n, err := w.svc.cfg.Tokenizer.CountText(pieces[i].Content)
				if err != nil {
					return 0, err
				}
				sizes[i] = n + pieceOverhead
			}
			return sizes[i], nil
		}
	}
	size, wantSize := sizer(cur.pieces), sizer(want)
	// What the growth needs: the wanted pieces cur lacks, within budget.
	need := 0
	for i, p := range want {
		if cur.has(p.Path, p.Lines) {
			continue
		}
		n, err := wantSize(i)
		if err != nil {
			return nil, 0, 0, err
		}
		if need+n <= budget {
			need += n
		}
	}
	if need == 0 {
		return cur, 0, 0, nil
	}
	keep, free := len(cur.pieces), w.threshold-cur.tokens
	for keep > 0 && free < need {
		n, err := size(keep - 1)
		if err != nil {
			return nil, 0, 0, err
		}
		free += n
		keep--
	}
	held := holdingsOf(cur.pieces[:keep])
	var add []codex.Piece
	used := 0
	for i, p := range want {
		if err := ctx.Err(); err != nil {
			return nil, 0, 0, err
		}
		if held.has(p.Path, p.Lines) || (p.Lines == "" && held.files[p.Path]) {
			continue
		}
		n, err := wantSize(i)
		if err != nil {
			return nil, 0, 0, err
		}
		if used+n <= min(budget, free) {
			add = append(add, p)
			used += n
			held.add(p)
		}
	}
	if len(add) == 0 {
		return cur, 0, 0, nil
	}
	// Take back the dropped pieces, in order, while the growth leaves room:
	// one it adds again stays where it was.
	free -= used
	for keep < len(cur.pieces) {
		p := cur.pieces[keep]
		if j := slices.IndexFunc(add, func(a codex.Piece) bool { return a.Path == p.Path && a.Lines == p.Lines }); j >= 0 {
			add = slices.Delete(add, j, j+1)
			keep++
			continue
		}
		n, err := size(keep)
		if err != nil {
			return nil, 0, 0, err
		}
		if n > free || slices.ContainsFunc(add, func(a codex.Piece) bool { return a.Path == p.Path && (a.Lines == "" || p.Lines == "") }) {
			break
		}
		free -= n
		keep++
	}
	choice, err := w.fit(append(slices.Clone(cur.pieces[:keep]), add...), keep)
	if err != nil {
		return nil, 0, 0, err
	}
	added := len(choice.pieces) - keep
	if added <= 0 { // the exact count left none of them: nothing is dropped for nothing
		return cur, 0, 0, nil
	}
	return choice, added, len(cur.pieces) - keep, nil
}

// Absorb grows the working set at its end by excerpts (the most wanted
// first) that it does not hold, at most budget tokens of them. It is the
// governor's way to keep a conversation's excerpts when it drops them from
// the history, at an epoch: the conversation after the codex block is
// evaluated again then anyway, so the excerpts cost only themselves
// there, and every later question finds them in the prefix. It returns
// the codex block to render now, which excerpts the working set holds,
// and what it did; it changes nothing while another move is being chosen,
// before the first question, or when nothing fits.
func (w *workingSet) Absorb(ctx context.Context, excerpts []ctxd.Excerpt, budget int) (runcontext.Codex, func(ctxd.Excerpt) bool, ctxd.WorkingSet, error) {
	want := make([]codex.Piece, 0, len(excerpts))
	for _, e := range excerpts {
		want = append(want, codex.Piece{Path: e.Path, Lines: e.Lines, Content: e.Text})
	}
	w.mu.Lock()
	view := wsView{cur: w.cur, gen: w.gen}
	var m *wsMove
	if w.cur != nil && !w.moving && budget > 0 && len(want) > 0 {
		w.moving = true
		m = &wsMove{kind: moveGrow, gen: w.gen, cur: w.cur, want: want, budget: budget, baseTokens: w.baseTokens,
			reason: fmt.Sprintf("of %d excerpts the conversation held, as its history dropped them (an epoch: what follows the codex block is evaluated again anyway)", len(excerpts))}
	}
	w.mu.Unlock()
	if m != nil {
		var err error
		if view, err = w.move(ctx, m); err != nil {
			return runcontext.Codex{}, nil, ctxd.WorkingSet{}, err
		}
	}
	block, _, report := view.answer(w.base, nil)
	cur := view.cur
	holds := func(e ctxd.Excerpt) bool { return cur != nil && cur.has(e.Path, e.Lines) }
	return block, holds, report, nil
}

// carry is the working set of the codex before the reload read again
// from this one: the same pieces in the same order (a whole file whole, a
// chunk by its lines), without those whose file is gone or shorter now; so
// its block changes from the first edited piece on. With the walk's
// EditsLast (a backend that shifts cached chunks) the edited pieces go to
// its end instead, the others keeping their order, so the backend shifts
// those after an edit. nil if nothing is left of it.
func (w *workingSet) carry(ctx context.Context) (*wsChoice, error) {
	pos := w.positions()
	var pieces, edited []codex.Piece
	for _, p := range w.carried {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		i, ok := pos[p.Path]
		if !ok {
			continue
		}
		content, err := w.codex.Content(i)
		if err != nil {
			continue // changed since the load: the watcher's reload follows
		}
		if p.Lines != "" {
			if content, ok = linesOf(content, p.Lines); !ok {
				continue
			}
		}
		piece := codex.Piece{Path: p.Path, Lines: p.Lines, Content: content}
		if content != p.Content && w.svc.cfg.Settings.Walk.EditsLast {
			edited = append(edited, piece)
			continue
		}
		pieces = append(pieces, piece)
	}
	pieces = append(pieces, edited...)
	if len(pieces) == 0 {
		return nil, nil
	}
	return w.fit(pieces, 0)
}

// linesOf is lines "a-b" (1-based, inclusive) of content, as the chunker
// cuts them; false if content has fewer lines now.
func linesOf(content, lines string) (string, bool) {
	from, to, ok := strings.Cut(lines, "-")
	a, b := lineStart(from), lineStart(to)
	ls := strings.SplitAfter(content, "\n")
	if ls[len(ls)-1] == "" {
		ls = ls[:len(ls)-1]
	}
	if !ok || a < 1 || b < a || b > len(ls) {
		return "", false
	}
	return strings.Join(ls[a-1:b], ""), true
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

// rank orders the files the questions found: by their chunks' scores, the
// newer question weighing more (1, ½, ¼), then (if link) the other files
// of their directories at a share of its best file's score; ties in path
// order.
func (w *workingSet) rank(perQuestion [][]sqlite.Hit, link bool) ranking {
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
	if link {
		w.linkDirectories(scores)
	}
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

// holding is what a working set holds: files whole, chunks by
// "path:lines", and every file it holds any of.
type holding struct {
	whole, chunks, files map[string]bool
}

// holdingsOf is what pieces hold.
func holdingsOf(pieces []codex.Piece) *holding {
	h := &holding{whole: map[string]bool{}, chunks: map[string]bool{}, files: map[string]bool{}}
	for _, p := range pieces {
		h.add(p)
	}
	return h
}

// add records that p is held.
func (h *holding) add(p codex.Piece) {
	h.files[p.Path] = true
	if p.Lines == "" {
		h.whole[p.Path] = true
	} else {
		h.chunks[p.Path+":"+p.Lines] = true
	}
}

// has reports whether the piece of path at lines ("": the whole file) is
// held, itself or within the whole file.
func (h *holding) has(path, lines string) bool {
	return h.whole[path] || h.chunks[path+":"+lines]
}

// first picks the ranked files into budget and renders them in the
// codex's order, checked exactly. When the exact count overshoots the
// estimate, the budget shrinks by the overshoot and the files are picked
// again, so chunks can take the place of a whole file that did not fit
// after all; after three tries the lowest-ranked pieces are dropped while
// over the threshold.
func (w *workingSet) first(ctx context.Context, r ranking, budget int) (*wsChoice, error) {
	pieces, err := w.pick(ctx, r, budget, nil)
	if err != nil {
		return nil, err
	}
	for try := 0; ; try++ {
		sorted := slices.Clone(pieces)
		w.sortByCodex(sorted)
		choice, err := w.render(sorted)
		if err != nil {
			return nil, err
		}
		if choice.tokens <= w.threshold || len(pieces) == 0 {
			return choice, nil
		}
		if try >= 3 {
			pieces = pieces[:len(pieces)-1]
			continue
		}
		budget -= choice.tokens - w.threshold
		if pieces, err = w.pick(ctx, r, budget, nil); err != nil {
			return nil, err
		}
	}
}

// fit renders pieces, in their order, counted exactly; while the stable
// blocks with them are over the threshold (the pieces' sizes are
// estimates), the last piece is dropped, but none of the first keep.
func (w *workingSet) fit(pieces []codex.Piece, keep int) (*wsChoice, error) {
	for {
		choice, err := w.render(pieces)
		if err != nil {
			return nil, err
		}
		if choice.tokens <= w.threshold || len(pieces) <= keep {
			return choice, nil
		}
		pieces = pieces[:len(pieces)-1]
	}
}

// pick fills budget with the ranked files, in rank order, leaving out
// what held holds already (nil: nothing): whole where they fit and no
// part of them is held, their best chunks where not. Piece sizes are
// estimates (pieceOverhead).
func (w *workingSet) pick(ctx context.Context, r ranking, budget int, held *holding) ([]codex.Piece, error) {
	if held == nil {
		held = holdingsOf(nil)
	}
	var pieces []codex.Piece
	used := 0
	for _, i := range r.files {
		if budget-used < 64 {
			break
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		f := w.codex.Files[i].Path
		if held.whole[f] {
			continue
		}
		if !held.files[f] {
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
		}
		for _, c := range r.chunks[i] {
			lines := fmt.Sprintf("%d-%d", c.chunk.Start, c.chunk.End)
			if held.has(f, lines) {
				continue
			}
			m, err := w.svc.cfg.Tokenizer.CountText(c.chunk.Text)
			if err != nil {
				return nil, err
			}
			if used+m+pieceOverhead <= budget {
				pieces = append(pieces, codex.Piece{Path: f, Lines: lines, Content: c.chunk.Text})
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

// sortByCodex puts pieces in the codex's order (the most stable files
// first, with codex.order = "stability"), a file's pieces by their lines:
// the first working set's order.
func (w *workingSet) sortByCodex(pieces []codex.Piece) {
	pos := w.positions()
	slices.SortStableFunc(pieces, func(a, b codex.Piece) int {
		if a.Path != b.Path {
			return pos[a.Path] - pos[b.Path]
		}
		return lineStart(a.Lines) - lineStart(b.Lines)
	})
}

// render builds the codex block of the map and pieces, in their order,
// and counts the stable blocks with it.
func (w *workingSet) render(pieces []codex.Piece) (*wsChoice, error) {
	h := holdingsOf(pieces)
	choice := &wsChoice{pieces: pieces, holding: h}
	for p := range h.files {
		choice.held = append(choice.held, p)
	}
	slices.Sort(choice.held)
	// The map, the working set, then the codex's totals (which change
	// with every edit: last, so an edit outside the working set costs
	// only them). The base block is the map and the totals. Nothing
	// before the pieces counts them, so a growth leaves it the same.
	totals := w.codex.Totals()
	mapBody := strings.TrimSuffix(w.base.Body, "\n"+totals)
	block := runcontext.Codex{Name: w.base.Name, Mode: runcontext.ModeRAG, Files: w.base.Files,
		Body: mapBody + "\nWorking set: files relevant to the questions, whole or in part (lines); it grows at its end as the questions move:\n" +
			codex.RenderPieces(pieces) + "\n" + totals}
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

// piecesToCarry is the working set's pieces, for the next codex to read
// again (nil before the first question); their content as it was tells
// which of them an edit changed.
func (w *workingSet) piecesToCarry() []codex.Piece {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.cur == nil {
		return w.carried // never chosen here: the one before goes on
	}
	return slices.Clone(w.cur.pieces)
}
