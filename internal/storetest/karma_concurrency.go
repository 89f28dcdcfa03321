package storetest

import (
	"fmt"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/karma"
)

// karmaConcurrencyCases are the karma contract under concurrent writes:
// the events of a trace apply one at a time, in the order they are
// stored, and a write the state forbids fails rather than overwriting
// another.
var karmaConcurrencyCases = []struct {
	name string
	run  func(t *testing.T, s ctxd.KarmaStore)
}{
	{"concurrent events on one trace", func(t *testing.T, s ctxd.KarmaStore) {
		ctx := t.Context()
		id := Record(t, s, "dev", "q", T0)
		actions := []string{ctxd.KarmaPin, ctxd.KarmaVerify, ctxd.KarmaUnpin, ctxd.KarmaReject}
		var wg sync.WaitGroup
		errs := make(chan error, writers*rounds)
		for w := range writers {
			wg.Go(func() {
				for r := range rounds {
					ev := ctxd.KarmaEvent{Trace: id, Action: actions[(w+r)%len(actions)], Sigil: "judge",
						Note: fmt.Sprintf("w%d r%d", w, r), At: T0.Add(time.Duration(w*rounds+r+1) * time.Second)}
					if ev.Action == ctxd.KarmaPin || ev.Action == ctxd.KarmaUnpin {
						ev.Note = ""
					}
					if _, err := s.KarmaEvent(ctx, ev); err != nil {
						errs <- err
					}
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
		tr, evs, err := s.Trace(ctx, id)
		if err != nil || len(evs) != writers*rounds {
			t.Fatalf("trace %+v with %d events, %v; want %d events", tr, len(evs), err, writers*rounds)
		}
		if folded, err := karma.Fold(tr, evs, time.Time{}); err != nil || !reflect.DeepEqual(folded, tr) {
			t.Errorf("the trace %+v is not the fold of its events in their order, %+v (%v)", tr, folded, err)
		}
	}},
	{"concurrent supersedes", func(t *testing.T, s ctxd.KarmaStore) {
		// Two corrections of one trace at once: one supersedes it, the
		// other is refused.
		ctx := t.Context()
		for i := range 5 {
			old := Record(t, s, "dev", fmt.Sprint("old ", i), T0)
			fixes := []int64{Record(t, s, "dev", fmt.Sprint("fix a ", i), T0), Record(t, s, "dev", fmt.Sprint("fix b ", i), T0)}
			errs := make([]error, len(fixes))
			start := make(chan struct{})
			var wg sync.WaitGroup
			for j, fix := range fixes {
				wg.Go(func() {
					<-start
					_, errs[j] = s.KarmaEvent(ctx, ctxd.KarmaEvent{Trace: old, Action: ctxd.KarmaSupersede, Other: fix, Sigil: "judge", At: T0.Add(time.Hour)})
				})
			}
			close(start)
			wg.Wait()
			won := 0
			for j, err := range errs {
				switch {
				case err == nil:
					won++
				case ctxd.KindOf(err) != ctxd.KindConflict:
					t.Errorf("trace %d superseding trace %d: %v; want success or a conflict", fixes[j], old, err)
				}
			}
			tr, evs, err := s.Trace(ctx, old)
			if won != 1 || err != nil || len(evs) != 1 || tr.SupersededBy != evs[0].Other {
				t.Errorf("%d of two corrections superseded trace %d: %+v, events %+v, %v; want one", won, old, tr, evs, err)
			}
		}
	}},
	{"concurrent snapshots", func(t *testing.T, s ctxd.KarmaStore) {
		// Daemons choosing a session's next karma epoch at once: one
		// snapshot is saved, the others are conflicts.
		ctx := t.Context()
		errs := make([]error, writers)
		start := make(chan struct{})
		var wg sync.WaitGroup
		for w := range writers {
			wg.Go(func() {
				<-start
				errs[w] = s.SaveKarmaSnapshot(ctx, ctxd.KarmaSnapshot{Session: "sess", Sigil: "dev", KarmaEpoch: 1, Reason: fmt.Sprint("w", w), At: T0})
			})
		}
		close(start)
		wg.Wait()
		saved := 0
		for w, err := range errs {
			switch {
			case err == nil:
				saved++
			case ctxd.KindOf(err) != ctxd.KindConflict:
				t.Errorf("writer %d: %v; want success or a conflict", w, err)
			}
		}
		if snaps, err := s.KarmaSnapshots(ctx, "sess"); saved != 1 || err != nil || len(snaps) != 1 {
			t.Errorf("%d saved, %d stored (%v); want one", saved, len(snaps), err)
		}
	}},
}
