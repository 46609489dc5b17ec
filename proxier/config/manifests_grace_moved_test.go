package config

import (
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	testclock "k8s.io/utils/clock/testing"
)

// A file's objects moved to another file that is not read yet (a git
// checkout that moves a.yaml to b.yaml unlinks a.yaml, then writes b.yaml
// later in the checkout) must be handed over, not deleted and added again.
// dropGone, which the re-check runs while a settle is pending, reads no
// file and so does not see that b.yaml provides them: it deletes them, and
// the settle's reload adds them back (new proxy ports, affinity lost).
// A reload at the same moment hands them over with no event.
func TestDropGoneKeepsObjectsAnUnreadFileMayProvide(t *testing.T) {
	for _, viaDropGone := range []bool{false, true} {
		name := "reload"
		if viaDropGone {
			name = "dropGone"
		}
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			a, b, busy := filepath.Join(dir, "a.yaml"), filepath.Join(dir, "b.yaml"), filepath.Join(dir, "busy.yaml")
			writeFile(t, a, serviceYAML("web", 80))
			writeFile(t, busy, serviceYAML("busy", 80))
			clk := testclock.NewFakeClock(time.Now())
			src, rec, log := manualSource(dir, WithClock(clk))
			src.reload()
			rec.take()

			if err := os.Remove(a); err != nil {
				t.Fatal(err)
			}
			src.removedAt["a.yaml"] = clk.Now() // as Run notes the event
			clk.Step(100 * time.Millisecond)
			src.reload() // a capped settle's reload in the middle of the checkout: a.yaml gone, b.yaml not yet there
			if got := rec.take(); len(got) != 0 {
				t.Fatalf("events within the grace: %q", got)
			}
			writeFile(t, b, serviceYAML("web", 80)) // the checkout goes on: b.yaml written
			writeFile(t, busy, serviceYAML("busy", 81))
			clk.Step(defaultVanishedGrace)
			if viaDropGone {
				src.dropGone() // the re-check, fired while the settle is pending
			} else {
				src.reload()
			}
			got := rec.take()
			src.reload() // the settle's reload
			got = append(got, rec.take()...)
			if strings.Contains(strings.Join(got, "\n"), "Service default/web") {
				t.Errorf("events for the moved Service: %q, want none (handed to b.yaml)", got)
			}
			if log.String() != "[]" {
				t.Errorf("unexpected errors: %s", log)
			}
		})
	}
}

// The same with the watcher and real time: busy.yaml rewritten every 30 ms
// (the settle is capped at 1 s), a.yaml removed shortly before a capped
// reload, and its Service written to b.yaml right after that reload.
func TestMovedFileBesideAStreamOfWrites(t *testing.T) {
	dir := t.TempDir()
	a, b, busy := filepath.Join(dir, "a.yaml"), filepath.Join(dir, "b.yaml"), filepath.Join(dir, "busy.yaml")
	writeFile(t, a, serviceYAML("web", 80))
	writeFile(t, busy, serviceYAML("busy", 1000))
	rec, _ := startSource(t, dir, []string{"add Service default/busy", "add Service default/web"}, WithPollInterval(time.Hour))
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for i := 1001; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(30 * time.Millisecond):
				_ = rewriteInPlace(busy, []byte(serviceYAML("busy", i))) // never empty: see rewriteInPlace
			}
		}
	}()
	defer func() { close(stop); <-done }()
	// Reload times, from busy's updates.
	var mu sync.Mutex
	var reloads []time.Time
	waitReload := func(after time.Time) time.Time {
		deadline := time.Now().Add(5 * time.Second)
		for time.Now().Before(deadline) {
			for _, e := range rec.take() {
				if e == "update Service default/busy" {
					mu.Lock()
					reloads = append(reloads, time.Now())
					mu.Unlock()
				} else {
					t.Logf("%v: %s", time.Now().Format("15:04:05.000"), e)
					if strings.Contains(e, "default/web") {
						t.Errorf("event for the moved Service: %s", e)
					}
				}
			}
			mu.Lock()
			if n := len(reloads); n > 0 && reloads[n-1].After(after) {
				r := reloads[n-1]
				mu.Unlock()
				return r
			}
			mu.Unlock()
			time.Sleep(2 * time.Millisecond)
		}
		t.Fatal("no reload")
		return time.Time{}
	}
	r1 := waitReload(time.Now())
	time.Sleep(time.Until(r1.Add(850 * time.Millisecond)))
	if err := os.Remove(a); err != nil { // git: unlink the old path first
		t.Fatal(err)
	}
	removed := time.Now()
	r2 := waitReload(removed) // the capped reload: a.yaml gone, b.yaml not yet there
	writeAtomic(t, b, serviceYAML("web", 80))
	t.Logf("removed %v after r1, r2 %v after removal, b.yaml written %v after removal", removed.Sub(r1), r2.Sub(removed), time.Since(removed))
	r3 := waitReload(time.Now())
	waitReload(r3)
}
