package persona

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/ctxd/ctxd"
)

// fake is a request path that counts its evacuations and restores, and
// what is resident across all fakes of a test.
type fake struct {
	name string
	w    *world
	fail error // Restore fails with it
}

type world struct {
	mu       sync.Mutex
	resident map[string]int64
	peak     int64
	events   []string
}

func (w *world) set(name string, bytes int64, ev string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if bytes == 0 {
		delete(w.resident, name)
	} else {
		w.resident[name] = bytes
	}
	var sum int64
	for _, b := range w.resident {
		sum += b
	}
	w.peak = max(w.peak, sum)
	w.events = append(w.events, ev+" "+name)
}

func (f *fake) Evacuate(context.Context) error { f.w.set(f.name, 0, "evacuate"); return nil }
func (f *fake) Restore(context.Context) error {
	if f.fail != nil {
		return f.fail
	}
	f.w.set(f.name, 1<<30, "restore")
	return nil
}

func spec(w *world, name string, pinned bool) Spec[*fake] {
	return Spec[*fake]{Name: name, Pinned: pinned, Planned: 1 << 30, Open: func(context.Context) (*fake, error) {
		w.set(name, 1<<30, "load")
		return &fake{name: name, w: w}, nil
	}}
}

// TestTwoOfThree: a budget that holds two personas of three; asks that
// alternate among them evacuate the one idle longest, never a busy or a
// pinned one, and memory never goes past the budget.
func TestTwoOfThree(t *testing.T) {
	w := &world{resident: map[string]int64{}}
	p, err := New(Config{Budget: 2 << 30}, spec(w, "a", true), spec(w, "b", false), spec(w, "c", false))
	if err != nil {
		t.Fatal(err)
	}
	use := func(name string) {
		t.Helper()
		var said []string
		_, release, err := p.Acquire(t.Context(), name, "any", func(s string) { said = append(said, s) })
		if err != nil {
			t.Fatal(err)
		}
		release()
		if len(said) == 0 && w.resident[name] == 0 {
			t.Fatalf("%s: no progress said", name)
		}
	}
	for _, n := range []string{"a", "b", "c", "b", "c", "a", "b"} {
		use(n)
	}
	if w.peak > 2<<30 {
		t.Fatalf("peak %d MiB over the 2048 MiB budget", w.peak>>20)
	}
	st, _, _ := p.Statuses()
	if st[0].Evacuations != 0 {
		t.Fatalf("the pinned persona was evacuated: %+v", st)
	}
	want := []string{"load a", "load b", "evacuate b", "load c", "evacuate c", "restore b", "evacuate b", "restore c", "evacuate c", "restore b"}
	if len(w.events) != len(want) {
		t.Fatalf("events %v, want %v", w.events, want)
	}
	for i := range want {
		if w.events[i] != want[i] {
			t.Fatalf("events %v, want %v", w.events, want)
		}
	}
	// A persona in use is not evacuated: c waits until b is released.
	_, releaseB, err := p.Acquire(t.Context(), "b", "any", nil)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan error)
	waiting := make(chan string, 4)
	go func() {
		_, rel, err := p.Acquire(t.Context(), "c", "any", func(s string) { waiting <- s })
		if err == nil {
			rel()
		}
		got <- err
	}()
	select {
	case s := <-waiting:
		t.Logf("c: %s", s)
	case <-time.After(10 * time.Second):
		t.Fatal("c said nothing while it waited")
	}
	select {
	case err := <-got:
		t.Fatalf("c was served while b was in use and a is pinned: %v", err)
	case <-time.After(50 * time.Millisecond):
	}
	releaseB()
	if err := <-got; err != nil {
		t.Fatal(err)
	}
}

// TestRefusals: an unknown persona, a sigil it is not open to, and one
// that cannot fit beside the pinned ones are refused with what to do.
func TestRefusals(t *testing.T) {
	w := &world{resident: map[string]int64{}}
	big := spec(w, "big", false)
	big.Planned = 2 << 30
	closed := spec(w, "closed", false)
	closed.Sigils = []string{"alice"}
	p, err := New(Config{Budget: 2 << 30}, spec(w, "a", true), big, closed)
	if err != nil {
		t.Fatal(err)
	}
	if _, r, err := p.Acquire(t.Context(), "a", "bob", nil); err != nil {
		t.Fatal(err)
	} else {
		r()
	}
	for name, want := range map[string]ctxd.Kind{"nope": ctxd.KindNotFound, "closed": ctxd.KindForbidden, "big": ctxd.KindUnavailable} {
		if _, _, err := p.Acquire(t.Context(), name, "bob", nil); ctxd.KindOf(err) != want {
			t.Errorf("%s: %v, want kind %s", name, err, want)
		}
	}
	if _, r, err := p.Acquire(t.Context(), "closed", "alice", nil); err != nil {
		t.Fatal(err)
	} else {
		r()
	}
}

// TestFailedRestoreIsReported: a restore that fails is the request's
// error, and the next request tries again.
func TestFailedRestoreIsReported(t *testing.T) {
	w := &world{resident: map[string]int64{}}
	p, err := New(Config{Budget: 1 << 30}, spec(w, "a", false), spec(w, "b", false))
	if err != nil {
		t.Fatal(err)
	}
	a, r, err := p.Acquire(t.Context(), "a", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	r()
	if _, r, err = p.Acquire(t.Context(), "b", "", nil); err != nil {
		t.Fatal(err)
	}
	r()
	a.fail = errors.New("disk gone")
	if _, _, err := p.Acquire(t.Context(), "a", "", nil); ctxd.KindOf(err) != ctxd.KindUnavailable {
		t.Fatalf("failed restore: %v", err)
	}
	a.fail = nil
	if _, r, err = p.Acquire(t.Context(), "", "", nil); err != nil {
		t.Fatal(err)
	}
	r()
	if st, _, _ := p.Statuses(); st[0].State != Resident || st[1].State != Evacuated {
		t.Fatalf("statuses %+v", st)
	}
}

// TestRaisedPlanEvacuates: a plan raised past the budget (a server seen
// to hold more than planned) evacuates the idle persona used longest ago
// until the resident ones fit again.
func TestRaisedPlanEvacuates(t *testing.T) {
	w := &world{resident: map[string]int64{}}
	p, err := New(Config{Budget: 2 << 30}, spec(w, "a", false), spec(w, "b", false))
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"a", "b"} {
		_, r, err := p.Acquire(t.Context(), n, "", nil)
		if err != nil {
			t.Fatal(err)
		}
		r()
	}
	if got := p.SetPlanned("b", 1<<30+1<<20); len(got) != 1 || got[0] != "a" {
		t.Fatalf("raising b's plan past the budget evacuated %v, want [a]", got)
	}
	if _, _, used := p.Statuses(); used > 2<<30 {
		t.Fatalf("%d bytes planned after the raise, over the budget", used)
	}
}

// TestClose: after Close nothing loads, and every path ever loaded is
// returned to be closed.
func TestClose(t *testing.T) {
	w := &world{resident: map[string]int64{}}
	p, err := New(Config{Budget: 1 << 30}, spec(w, "a", false), spec(w, "b", false), spec(w, "c", false))
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"a", "b"} { // b evacuates a
		_, r, err := p.Acquire(t.Context(), n, "", nil)
		if err != nil {
			t.Fatal(err)
		}
		r()
	}
	if got := p.Close(); len(got) != 2 || got[0].name != "a" || got[1].name != "b" {
		t.Fatalf("Close returned %v, want a and b", got)
	}
	if _, _, err := p.Acquire(t.Context(), "a", "", nil); ctxd.KindOf(err) != ctxd.KindUnavailable {
		t.Fatalf("an ask after Close: %v", err)
	}
}

// TestEvacuateIdle: under critical memory pressure every idle persona but
// the one used last is evacuated; a pinned one and one answering stay.
func TestEvacuateIdle(t *testing.T) {
	w := &world{resident: map[string]int64{}}
	p, err := New(Config{Budget: 8 << 30}, spec(w, "pinned", true), spec(w, "idle", false), spec(w, "busy", false), spec(w, "last", false))
	if err != nil {
		t.Fatal(err)
	}
	var releaseBusy func()
	for _, n := range []string{"pinned", "idle", "busy", "last"} {
		_, r, err := p.Acquire(t.Context(), n, "", nil)
		if err != nil {
			t.Fatal(err)
		}
		if n == "busy" {
			releaseBusy = r
		} else {
			r()
		}
	}
	defer releaseBusy()
	if got := p.EvacuateIdle("test"); len(got) != 1 || got[0] != "idle" {
		t.Fatalf("evacuated %v, want [idle]", got)
	}
}

// TestProgressOutsideTheLock: progress may block (it writes to a client),
// so it is told with the pool's lock let go: the pool answers meanwhile.
func TestProgressOutsideTheLock(t *testing.T) {
	w := &world{resident: map[string]int64{}}
	p, err := New(Config{Budget: 1 << 30}, spec(w, "a", false), spec(w, "b", false))
	if err != nil {
		t.Fatal(err)
	}
	calls := 0
	_, r, err := p.Acquire(t.Context(), "b", "", func(string) {
		calls++
		done := make(chan struct{})
		go func() { p.Statuses(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatal("the pool was locked while progress ran")
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	r()
	if calls == 0 {
		t.Fatal("loading b said nothing")
	}
}
