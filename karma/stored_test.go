package karma

import (
	"testing"
	"time"

	"github.com/ctxd/ctxd"
)

func TestBindingRoundTrip(t *testing.T) {
	if BindingJSON(nil) != "" {
		t.Error("no binding is stored as the empty string")
	}
	b := &ctxd.TraceBinding{Codex: "v1", Files: []ctxd.TraceFile{{Path: "a.go", SHA256: "ab", Cited: true}}}
	got, err := ParseBinding(BindingJSON(b))
	if err != nil || got.Codex != "v1" || len(got.Files) != 1 || !got.Files[0].Cited {
		t.Errorf("round trip: %+v %v", got, err)
	}
	if got, err := ParseBinding(""); got != nil || err != nil {
		t.Errorf("empty: %+v %v", got, err)
	}
	if _, err := ParseBinding("{"); err == nil {
		t.Error("a broken binding read without error")
	}
}

// TestFoldPage: a page is folded as of the filter's time, filtered by
// status and by the text document its latest judgement wrote, and cut at
// the limit.
func TestFoldPage(t *testing.T) {
	t0 := time.Unix(1700000000, 0)
	page := []ctxd.Trace{
		{ID: 3, Sigil: "s", CreatedAt: t0, Status: ctxd.TraceRecorded},
		{ID: 2, Sigil: "s", CreatedAt: t0, Status: ctxd.TraceRecorded},
		{ID: 1, Sigil: "s", CreatedAt: t0, Status: ctxd.TraceRecorded},
	}
	evs := []StoredEvent{
		{ID: 10, KarmaEvent: ctxd.KarmaEvent{Trace: 2, Action: ctxd.KarmaVerify, Sigil: "s", At: t0.Add(time.Minute)}},
		{ID: 11, KarmaEvent: ctxd.KarmaEvent{Trace: 1, Action: ctxd.KarmaVerify, Sigil: "s", At: t0.Add(time.Hour)}},
	}
	f := ctxd.TraceFilter{Status: ctxd.TraceVerified, At: t0.Add(30 * time.Minute)}
	out, full, err := FoldPage(nil, page, evs, f, false, nil, 10)
	if err != nil || full || len(out) != 1 || out[0].ID != 2 {
		t.Fatalf("verified as of t0+30m: %+v full=%v %v, want trace 2 alone", out, full, err)
	}
	f.At = t0.Add(2 * time.Hour)
	if out, full, _ := FoldPage(nil, page, evs, f, false, nil, 1); !full || len(out) != 1 || out[0].ID != 2 {
		t.Errorf("limit 1: %+v full=%v", out, full)
	}
	// Text: trace 1's document is now its judgement's (11), trace 3's its own (-3).
	f.Status = ""
	out, _, _ = FoldPage(nil, page, evs, f, true, map[int64]bool{11: true, -3: true, -1: true}, 10)
	if len(out) != 2 || out[0].ID != 3 || out[1].ID != 1 {
		t.Errorf("text filter: %+v, want traces 3 and 1", out)
	}
	if docs := TextDocs([]int64{1, 2}, evs); len(docs) != 4 || docs[0] != -1 || docs[3] != 11 {
		t.Errorf("TextDocs = %v", docs)
	}
}
