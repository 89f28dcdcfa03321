package secrets

// keywordMatcher finds every occurrence of a set of keywords in a text in
// one pass, ignoring ASCII case: an Aho-Corasick automaton compiled to a
// full DFA over byte classes. Bytes that occur in no keyword share one
// class, and an upper-case ASCII letter is in its lower-case letter's
// class, so the text needs no lower-cased copy.
type keywordMatcher struct {
	class  [256]uint8
	nclass int
	// next[s+class] is the state after state s on a byte of that class.
	// States are numbered premultiplied by nclass, the states that end a
	// keyword last: from firstOut on.
	next     []int32
	firstOut int32
	out      [][]int // per state (divided by nclass) >= firstOut: the keywords ending there
	lens     []int   // keyword lengths
	maxLen   int
}

// hit is a keyword found: its start and id.
type hit struct{ start, id int }

// newKeywordMatcher compiles lower-case ASCII keywords (empty ones are
// ignored). Keyword i is reported as i.
func newKeywordMatcher(keywords []string) *keywordMatcher {
	m := &keywordMatcher{lens: make([]int, len(keywords))}
	m.nclass = 1
	for _, k := range keywords {
		for i := 0; i < len(k); i++ {
			if c := k[i]; m.class[c] == 0 {
				m.class[c] = uint8(m.nclass)
				m.nclass++
			}
		}
	}
	for c := 'A'; c <= 'Z'; c++ {
		m.class[c] = m.class[c+'a'-'A']
	}
	// The trie, with transitions by class.
	type node struct {
		next map[uint8]int
		fail int
		out  []int
	}
	nodes := []node{{next: map[uint8]int{}}}
	for id, k := range keywords {
		m.lens[id] = len(k)
		m.maxLen = max(m.maxLen, len(k))
		if k == "" {
			continue
		}
		s := 0
		for i := 0; i < len(k); i++ {
			c := m.class[k[i]]
			t, ok := nodes[s].next[c]
			if !ok {
				t = len(nodes)
				nodes = append(nodes, node{next: map[uint8]int{}})
				nodes[s].next[c] = t
			}
			s = t
		}
		nodes[s].out = append(nodes[s].out, id)
	}
	// Failure links breadth first, completing each state's transitions
	// into a DFA as we go.
	delta := make([][]int, len(nodes))
	for i := range delta {
		delta[i] = make([]int, m.nclass)
	}
	queue := []int{}
	for c := 0; c < m.nclass; c++ {
		if t, ok := nodes[0].next[uint8(c)]; ok {
			delta[0][c] = t
			queue = append(queue, t)
		}
	}
	for len(queue) > 0 {
		s := queue[0]
		queue = queue[1:]
		f := nodes[s].fail
		nodes[s].out = append(nodes[s].out, nodes[f].out...)
		for c := 0; c < m.nclass; c++ {
			if t, ok := nodes[s].next[uint8(c)]; ok {
				nodes[t].fail = delta[f][c]
				delta[s][c] = t
				queue = append(queue, t)
			} else {
				delta[s][c] = delta[f][c]
			}
		}
	}
	// Renumber: states without output first, so one comparison tells
	// whether a state reports anything.
	order := make([]int, len(nodes)) // old -> new
	n := 0
	for i := range nodes {
		if len(nodes[i].out) == 0 {
			order[i] = n
			n++
		}
	}
	m.firstOut = int32(n * m.nclass)
	for i := range nodes {
		if len(nodes[i].out) > 0 {
			order[i] = n
			n++
		}
	}
	m.next = make([]int32, len(nodes)*m.nclass)
	m.out = make([][]int, len(nodes)-int(m.firstOut)/m.nclass)
	for i := range nodes {
		for c, t := range delta[i] {
			m.next[order[i]*m.nclass+c] = int32(order[t] * m.nclass)
		}
		if len(nodes[i].out) > 0 {
			m.out[order[i]-int(m.firstOut)/m.nclass] = nodes[i].out
		}
	}
	return m
}

// scan calls hit for every occurrence of a keyword in s, in order of the
// occurrences' ends, with its start offset and the keyword's id.
func (m *keywordMatcher) scan(s string, hit func(start, id int)) {
	next, class, nc, firstOut := m.next, &m.class, int32(m.nclass), m.firstOut
	state := int32(0)
	for i := 0; i < len(s); i++ {
		state = next[state+int32(class[s[i]])]
		if state >= firstOut {
			for _, id := range m.out[(state-firstOut)/nc] {
				hit(i+1-m.lens[id], id)
			}
		}
	}
}

// appendHits appends every occurrence of a keyword in s to hits, in order
// of their starts (ties: of their ends). It runs four automata at once on
// four quarters of s (each going on past its quarter's end for the
// keywords that begin in it): a DFA's steps depend on each other, four
// streams of them do not.
func (m *keywordMatcher) appendHits(s string, hits []hit, quarters *[4][]hit) []hit {
	q := len(s) / 4
	if q < 64 {
		m.scan(s, func(start, id int) { hits = append(hits, hit{start, id}) })
		return hits
	}
	for k := range quarters {
		quarters[k] = quarters[k][:0]
	}
	next, class, nc, firstOut := m.next, &m.class, int32(m.nclass), m.firstOut
	report := func(k, end int, state int32) {
		for _, id := range m.out[(state-firstOut)/nc] {
			quarters[k] = append(quarters[k], hit{end + 1 - m.lens[id], id})
		}
	}
	s0, s1, s2, s3 := s[:q], s[q:2*q], s[2*q:3*q], s[3*q:4*q]
	var t0, t1, t2, t3 int32
	for i := 0; i < q; i++ {
		t0 = next[t0+int32(class[s0[i]])]
		t1 = next[t1+int32(class[s1[i]])]
		t2 = next[t2+int32(class[s2[i]])]
		t3 = next[t3+int32(class[s3[i]])]
		if t0 >= firstOut || t1 >= firstOut || t2 >= firstOut || t3 >= firstOut {
			if t0 >= firstOut {
				report(0, i, t0)
			}
			if t1 >= firstOut {
				report(1, q+i, t1)
			}
			if t2 >= firstOut {
				report(2, 2*q+i, t2)
			}
			if t3 >= firstOut {
				report(3, 3*q+i, t3)
			}
		}
	}
	// Each quarter's automaton goes on past its end for the keywords
	// that began in it; the last one to the end of s.
	states := [4]int32{t0, t1, t2, t3}
	for k, st := range states {
		end := min(len(s), (k+1)*q+m.maxLen-1)
		if k == 3 {
			end = len(s)
		}
		for i := (k + 1) * q; i < end; i++ {
			st = next[st+int32(class[s[i]])]
			if st >= firstOut {
				report(k, i, st)
			}
		}
	}
	for k := range quarters {
		for _, h := range quarters[k] {
			if k == 3 || h.start < (k+1)*q {
				hits = append(hits, h)
			}
		}
	}
	return hits
}

// contains reports whether s holds any of the keywords.
func (m *keywordMatcher) contains(s string) bool {
	next, class, firstOut := m.next, &m.class, m.firstOut
	state := int32(0)
	for i := 0; i < len(s); i++ {
		state = next[state+int32(class[s[i]])]
		if state >= firstOut {
			return true
		}
	}
	return false
}
