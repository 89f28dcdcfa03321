package bench

import (
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestQualitySets checks the answer-quality question sets as the phase
// reads them: three codices or more, 60 questions or more, some combining
// two files, and every accepted answer written in one of the files the
// question names, so that a careful reader of those files can answer it.
func TestQualitySets(t *testing.T) {
	sets, err := LoadQualitySets(filepath.Join("..", "testdata", "quality"))
	if err != nil {
		t.Fatal(err)
	}
	total, combined := 0, 0
	for _, s := range sets {
		setCombined := 0
		for _, q := range s.Questions {
			total++
			if len(q.Files) > 1 {
				combined++
				setCombined++
			}
			if len(q.Files) == 0 {
				t.Errorf("%s: names no file", q.ID)
			}
			var text strings.Builder
			for _, f := range q.Files {
				b, err := os.ReadFile(filepath.Join(s.dir, f))
				if err != nil {
					t.Errorf("%s: %v", q.ID, err)
				}
				text.Write(b)
				text.WriteByte('\n')
			}
			for _, a := range q.Answers {
				if !Graded(text.String(), []string{a}) {
					t.Errorf("%s: the answer %q is in none of %v", q.ID, a, q.Files)
				}
			}
		}
		if setCombined == 0 {
			t.Errorf("%s: no question combines two files", s.Codex)
		}
	}
	if len(sets) < 3 || total < 60 {
		t.Errorf("%d sets, %d questions: the phase wants at least 3 and 60", len(sets), total)
	}
	t.Logf("%d sets, %d questions, %d combining two files", len(sets), total, combined)
}

// TestGraded: normalised contains, case, Markdown marks and whitespace
// aside; an answer that does not hold the fact is wrong.
func TestGraded(t *testing.T) {
	for _, c := range []struct {
		answer string
		ok     bool
	}{
		{"The default burst is **48** tokens.", true},
		{"It is `ErrQuotaSpent`.", true},
		{"quota\n  spent", true},
		{"The default burst is 4 8.", false},
		{"I don't know.", false},
		{"", false},
	} {
		if got := Graded(c.answer, []string{"48", "errquotaspent", "Quota Spent"}); got != c.ok {
			t.Errorf("Graded(%q) = %v", c.answer, got)
		}
	}
	if Graded("anything", []string{"  "}) {
		t.Error("an empty accepted answer matched")
	}
}

// TestWilson against published values of the Wilson score interval.
func TestWilson(t *testing.T) {
	for _, c := range []struct {
		k, n   int
		lo, hi float64
	}{
		{0, 10, 0, 0.2775},
		{5, 10, 0.2366, 0.7634},
		{10, 10, 0.7225, 1},
		{33, 66, 0.3827, 0.6173},
	} {
		lo, hi := Wilson(c.k, c.n)
		if math.Abs(lo-c.lo) > 5e-4 || math.Abs(hi-c.hi) > 5e-4 {
			t.Errorf("Wilson(%d, %d) = %.4f, %.4f; want %.4f, %.4f", c.k, c.n, lo, hi, c.lo, c.hi)
		}
	}
	if lo, hi := Wilson(0, 0); lo != 0 || hi != 0 {
		t.Errorf("Wilson(0, 0) = %v, %v", lo, hi)
	}
}
