package scheduler

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"
)

// waitUntil polls the scheduler's status until cond holds, failing the test
// if it does not within a generous bound (a liveness check, not a timing).
func waitUntil(t *testing.T, s *Scheduler, cond func(Status) bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond(s.Status()) {
		if time.Now().After(deadline) {
			t.Fatalf("condition not reached; status %+v", s.Status())
		}
		time.Sleep(time.Millisecond)
	}
}

// TestEightSessionsTwoSlots runs 8 sessions of 5 requests each on 2 slots,
// releasing one running request at a time once every other session is
// waiting: at most 2 run at once, all finish, and the grants go round-robin
// across sessions.
func TestEightSessionsTwoSlots(t *testing.T) {
	t.Parallel()
	const sessions, turns, slots = 8, 5, 2
	s := New(Options{Slots: slots})
	type running struct {
		session int
		done    chan struct{}
	}
	granted := make(chan running)
	var wg sync.WaitGroup
	for i := range sessions {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for turn := range turns {
				id := fmt.Sprintf("s%d", i)
				release, _, err := s.Session(t.Context(), id)
				if err != nil {
					t.Error(err)
					return
				}
				l, err := s.Acquire(t.Context(), id, []int{1, 2, i, turn})
				if err != nil {
					t.Error(err)
					return
				}
				r := running{i, make(chan struct{})}
				granted <- r
				<-r.done
				l.Record([]int{1, 2, i, turn})
				l.Release()
				release()
			}
		}()
	}

	var order []int
	var inFlight []running
	for len(order) < sessions*turns {
		// Collect grants until both slots are busy (or nobody is left).
		left := sessions*turns - len(order)
		for len(inFlight) < min(slots, left) {
			select {
			case r := <-granted:
				order = append(order, r.session)
				inFlight = append(inFlight, r)
			case <-time.After(10 * time.Second):
				t.Fatalf("%d requests running, %d waiting: the scheduler does not fill its %d slots", len(inFlight), len(s.Status().Waiting), slots)
			}
		}
		st := s.Status()
		if st.Busy > slots {
			t.Fatalf("%d slots busy, only %d exist", st.Busy, slots)
		}
		// Let every session that is not running queue up before releasing
		// the oldest running request, so the order is deterministic.
		wantWaiting := min(sessions-slots, left-len(inFlight))
		waitUntil(t, s, func(st Status) bool { return len(st.Waiting) >= wantWaiting })
		close(inFlight[0].done)
		inFlight = inFlight[1:]
	}
	for _, r := range inFlight {
		close(r.done)
	}
	wg.Wait()

	// Round-robin: within each window of 8 consecutive grants every session
	// appears once.
	for i := 0; i+sessions <= len(order); i += sessions {
		seen := map[int]bool{}
		for _, sess := range order[i : i+sessions] {
			seen[sess] = true
		}
		if len(seen) != sessions {
			t.Errorf("grants %d–%d %v do not serve every session once (order %v)", i, i+sessions-1, order[i:i+sessions], order)
		}
	}
	if len(order) != sessions*turns {
		t.Errorf("%d grants, want %d", len(order), sessions*turns)
	}
}

func TestCancelledWaiterLeavesTheQueueAtOnce(t *testing.T) {
	t.Parallel()
	s := New(Options{Slots: 1})
	busy, err := s.Acquire(t.Context(), "a", nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	got := make(chan error, 1)
	go func() {
		_, err := s.Acquire(ctx, "b", nil)
		got <- err
	}()
	waitUntil(t, s, func(st Status) bool { return len(st.Waiting) == 1 })
	cancel()
	if err := <-got; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled Acquire returned %v", err)
	}
	if st := s.Status(); len(st.Waiting) != 0 || st.Busy != 1 {
		t.Fatalf("after cancel: %+v", st)
	}
	// The next waiter gets the slot when it frees; the cancelled one never does.
	next := make(chan *Lease, 1)
	go func() {
		l, err := s.Acquire(t.Context(), "c", nil)
		if err != nil {
			t.Error(err)
		}
		next <- l
	}()
	waitUntil(t, s, func(st Status) bool { return len(st.Waiting) == 1 })
	busy.Release()
	if l := <-next; l == nil || l.Slot != 0 || l.Ahead != 0 {
		t.Fatalf("next lease %+v", l)
	}
}

func TestSlotChoiceFollowsThePrefix(t *testing.T) {
	t.Parallel()
	s := New(Options{Slots: 2})
	ctx := t.Context()
	a, _ := s.Acquire(ctx, "a", []int{1, 2, 3})
	b, _ := s.Acquire(ctx, "b", []int{7, 8})
	if a.Slot != 0 || b.Slot != 1 {
		t.Fatalf("empty slots in order: a on %d, b on %d", a.Slot, b.Slot)
	}
	a.Record([]int{1, 2, 3})
	b.Record([]int{7, 8})
	a.Release()
	b.Release()
	cases := []struct {
		prompt       []int
		slot, cached int
	}{
		{[]int{7, 8, 9}, 1, 2},
		{[]int{1, 2, 3, 4}, 0, 3},
		{[]int{5}, 0, 0}, // a tie goes to the lowest slot
	}
	for _, c := range cases {
		l, err := s.Acquire(ctx, "x", c.prompt)
		if err != nil {
			t.Fatal(err)
		}
		if l.Slot != c.slot || l.Cached != c.cached {
			t.Errorf("prompt %v: slot %d with %d cached, want slot %d with %d", c.prompt, l.Slot, l.Cached, c.slot, c.cached)
		}
		l.Release()
	}
}

func TestSessionRunsOneRequestAtATime(t *testing.T) {
	t.Parallel()
	s := New(Options{Slots: 4})
	first, _, err := s.Session(t.Context(), "s")
	if err != nil {
		t.Fatal(err)
	}
	// Another session is not held up.
	other, _, err := s.Session(t.Context(), "t")
	if err != nil {
		t.Fatal(err)
	}
	other()

	order := make(chan int, 2)
	for i := 1; i <= 2; i++ {
		go func() {
			release, _, err := s.Session(t.Context(), "s")
			if err != nil {
				t.Error(err)
				return
			}
			order <- i
			release()
		}()
		waitUntil(t, s, func(st Status) bool { return st.InSessions == i })
	}
	// A cancelled waiter gives up its place without taking the session.
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, _, err := s.Session(ctx, "s"); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled wait: %v", err)
	}
	select {
	case i := <-order:
		t.Fatalf("request %d ran while the session was held", i)
	default:
	}
	first()
	if a, b := <-order, <-order; a != 1 || b != 2 {
		t.Errorf("served %d then %d, want arrival order", a, b)
	}
	waitUntil(t, s, func(st Status) bool { return st.InSessions == 0 })
}

func TestForgetDropsWhatALeaseWouldRecord(t *testing.T) {
	t.Parallel()
	s := New(Options{Slots: 1})
	l, _ := s.Acquire(t.Context(), "a", []int{1, 2})
	l.Record([]int{1, 2})
	s.Forget() // the backend restarted during the request
	l.Record([]int{1, 2, 3})
	l.Release()
	l.Release() // twice is harmless
	if st := s.Status(); st.Slots[0].HeldTokens != 0 || st.Busy != 0 {
		t.Errorf("after Forget: %+v", st)
	}
	l2, _ := s.Acquire(t.Context(), "a", []int{1, 2})
	if l2.Cached != 0 {
		t.Errorf("expected %d cached tokens after Forget", l2.Cached)
	}
}

func TestLCP(t *testing.T) {
	t.Parallel()
	cases := []struct {
		a, b []int
		want int
	}{
		{nil, nil, 0},
		{[]int{1, 2, 3}, []int{1, 2, 3, 4}, 3},
		{[]int{1, 2, 3}, []int{1, 9, 3}, 1},
		{[]int{5}, []int{6}, 0},
	}
	for _, c := range cases {
		if got := LCP(c.a, c.b); got != c.want {
			t.Errorf("LCP(%v, %v) = %d, want %d", c.a, c.b, got, c.want)
		}
	}
}

// TestChosenSlotsKeepConversationsWarm: where ctxd names the slot, a new
// session that can restore the shared prefix takes an empty slot rather
// than another session's conversation, and among equal slots the one used
// longest ago.
func TestChosenSlotsKeepConversationsWarm(t *testing.T) {
	t.Parallel()
	s := New(Options{Slots: 2, LeastRecentTies: true})
	ctx := t.Context()
	stable := []int{1, 2, 3}
	a, _ := s.AcquireRestorable(ctx, "a", append(stable, 10), 3)
	if a.Slot != 0 || !a.Restore {
		t.Fatalf("a: slot %d, restore %v", a.Slot, a.Restore)
	}
	a.Record(append(stable, 10)) // a's conversation on slot 0
	a.Release()
	b, _ := s.AcquireRestorable(ctx, "b", append(stable, 20), 3)
	if b.Slot != 1 || !b.Restore || b.Cached != 0 {
		t.Fatalf("b took slot %d (cached %d, restore %v): slot 1 can get the prefix restored and a's conversation stays", b.Slot, b.Cached, b.Restore)
	}
	b.Record(append(stable, 20))
	b.Release()
	// Each returns to its own slot.
	for _, c := range []struct {
		session string
		prompt  []int
		slot    int
	}{{"a", append(stable, 10, 11), 0}, {"b", append(stable, 20, 21), 1}} {
		l, _ := s.AcquireRestorable(ctx, c.session, c.prompt, 3)
		if l.Slot != c.slot || l.Restore || l.Cached != 4 {
			t.Errorf("%s: slot %d, %d cached, restore %v; want its own slot %d", c.session, l.Slot, l.Cached, l.Restore, c.slot)
		}
		l.Record(c.prompt)
		l.Release()
	}
	// A third session evicts the conversation used longest ago (a's).
	x, _ := s.AcquireRestorable(ctx, "x", append(stable, 30), 3)
	if x.Slot != 0 {
		t.Errorf("the third session took slot %d, want the least recently used, 0", x.Slot)
	}
}

// TestChosenSlotIsGrantedWhenEveryChoiceLoses: a prompt that shares
// nothing with what the only slot holds, with nothing to restore, still
// gets the slot (its worth is negative: taking it loses the conversation).
func TestChosenSlotIsGrantedWhenEveryChoiceLoses(t *testing.T) {
	t.Parallel()
	s := New(Options{Slots: 1, LeastRecentTies: true})
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	a, err := s.AcquireRestorable(ctx, "a", []int{1, 2, 3, 4}, 0)
	if err != nil {
		t.Fatal(err)
	}
	a.Record([]int{1, 2, 3, 4})
	a.Release()
	b, err := s.AcquireRestorable(ctx, "b", []int{9, 8}, 0)
	if err != nil {
		t.Fatalf("a prompt unlike the slot's content was never granted the free slot: %v", err)
	}
	if b.Slot != 0 || b.Cached != 0 || b.Restore {
		t.Errorf("b: slot %d, cached %d, restore %v", b.Slot, b.Cached, b.Restore)
	}
	b.Release()
}

// TestSideRequestLeavesTheLiveConversation: where ctxd picks the slot, a
// request of another session (an agent's side request) takes a free slot
// that holds no other session's live conversation, even one holding less
// of its prompt; once that conversation has gone quiet for liveFor, the
// slot that holds more of the prompt wins again.
func TestSideRequestLeavesTheLiveConversation(t *testing.T) {
	t.Parallel()
	now := time.Unix(1_000_000, 0)
	s := New(Options{Slots: 2, LeastRecentTies: true, Now: func() time.Time { return now }})
	ctx := t.Context()
	floor := []int{1, 2, 3, 4, 5, 6, 7, 8}
	m, _ := s.Acquire(ctx, "main", append(floor, 10, 11))
	m.Record(append(floor, 10, 11, 12))
	m.Release()
	side, _ := s.Acquire(ctx, "title", append(floor, 90))
	if side.Slot != 1 || side.Cached != 0 {
		t.Fatalf("the side request took slot %d (cached %d): it displaced the main conversation", side.Slot, side.Cached)
	}
	side.Record(append(floor, 90, 91))
	side.Release()
	next, _ := s.Acquire(ctx, "main", append(floor, 10, 11, 12, 13))
	if next.Slot != 0 || next.Cached != 11 || next.Previous != "main" {
		t.Errorf("main's next turn: slot %d, %d cached, previous %q", next.Slot, next.Cached, next.Previous)
	}
	next.Record(append(floor, 10, 11, 12, 13, 14))
	next.Release()
	// The second side request reuses the first's slot (it holds the floor).
	again, _ := s.Acquire(ctx, "title2", append(floor, 95))
	if again.Slot != 1 || again.Cached != 8 {
		t.Errorf("the next side request: slot %d, %d cached; want slot 1 with the floor", again.Slot, again.Cached)
	}
	again.Release()
	// Both quiet past liveFor: a new session takes the slot worth most.
	now = now.Add(liveFor + time.Second)
	x, _ := s.Acquire(ctx, "x", append(floor, 10, 11, 12, 13, 14, 50))
	if x.Slot != 0 {
		t.Errorf("after liveFor, slot %d; want 0, which holds most of the prompt", x.Slot)
	}
}

// TestSnapshotAndPut: what a snapshot reports comes back with Put after a
// Forget, and the next request of that conversation finds its slot.
func TestSnapshotAndPut(t *testing.T) {
	s := New(Options{Slots: 2, LeastRecentTies: true})
	for _, sess := range []struct {
		name   string
		prompt []int
	}{{"a", []int{1, 2, 3}}, {"b", []int{7, 8}}} {
		l, err := s.Acquire(t.Context(), sess.name, sess.prompt)
		if err != nil {
			t.Fatal(err)
		}
		l.Record(sess.prompt)
		l.Prefix("p-" + sess.name)
		l.Release()
	}
	snap := s.Snapshot()
	if len(snap) != 2 {
		t.Fatalf("snapshot %+v, want two slots", snap)
	}
	s.Forget()
	if got := s.Snapshot(); len(got) != 0 {
		t.Fatalf("after Forget the snapshot is %+v", got)
	}
	for _, h := range snap {
		s.Put(h)
	}
	s.Put(Held{Slot: 5, Tokens: []int{1}}) // out of range: ignored
	l, err := s.Acquire(t.Context(), "b", []int{7, 8, 9})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release()
	if want := snap[1].Slot; l.Slot != want || l.Cached != 2 {
		t.Fatalf("b's next request got slot %d with %d cached, want slot %d with 2", l.Slot, l.Cached, want)
	}
	if st := s.Status(); st.Slots[snap[0].Slot].Prefix != "p-a" {
		t.Fatalf("status after Put: %+v", st.Slots)
	}
}
