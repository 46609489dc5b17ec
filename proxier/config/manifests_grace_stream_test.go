package config

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// rewriteInPlace writes data over path's content, keeping the inode as an
// in-place rewrite does, without ever leaving the file empty: os.WriteFile
// truncates first, and a reload that came between its truncate and its
// write (a loaded machine deschedules the writer there) read the file
// empty, kept its objects for the emptied grace and sent no update of it.
// The stream tests take busy's updates for the marks of the reloads, so
// they missed one and acted a second late: web was gone past its grace
// ("events for web: [delete, add]"), about 1 run in 5 of -race under load.
func rewriteInPlace(path string, data []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	_, err = f.WriteAt(data, 0)
	if err == nil {
		err = f.Truncate(int64(len(data))) // serviceYAML's ports have 4 digits: no change
	}
	return errors.Join(err, f.Close())
}

func rewriteEvery30ms(t *testing.T, path string, name string) func() {
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for i := 1001; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(30 * time.Millisecond):
				_ = rewriteInPlace(path, []byte(serviceYAML(name, i)))
			}
		}
	}()
	return func() { close(stop); <-done }
}

// waitReloadAfter drains rec until an update of busy after 'after'; returns
// its time and the other events seen.
func waitBusyReload(t *testing.T, rec *manifestRecorder, after time.Time, other *[]string) time.Time {
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		seen := false
		for _, e := range rec.take() {
			if e == "update Service default/busy" {
				seen = true
			} else {
				*other = append(*other, time.Now().Format("15:04:05.000")+" "+e)
			}
		}
		if seen && time.Now().After(after) {
			return time.Now()
		}
		time.Sleep(2 * time.Millisecond)
	}
	t.Fatal("no reload")
	return time.Time{}
}

// A file removed and written again (git checkout, non-atomic) while another
// file is being rewritten: the re-check fires with the file back, which must
// be an edit (same content: no event).
func TestRecreatedWithinGraceBesideAStream(t *testing.T) {
	dir := t.TempDir()
	web, busy := filepath.Join(dir, "web.yaml"), filepath.Join(dir, "busy.yaml")
	writeFile(t, web, serviceYAML("web", 80))
	writeFile(t, busy, serviceYAML("busy", 1000))
	rec, log := startSource(t, dir, []string{"add Service default/busy", "add Service default/web"}, WithPollInterval(time.Hour))
	defer rewriteEvery30ms(t, busy, "busy")()
	var other []string
	r1 := waitBusyReload(t, rec, time.Now(), &other)
	time.Sleep(time.Until(r1.Add(850 * time.Millisecond)))
	if err := os.Remove(web); err != nil {
		t.Fatal(err)
	}
	removed := time.Now()
	waitBusyReload(t, rec, removed, &other) // found gone
	time.Sleep(100 * time.Millisecond)
	writeFile(t, web, serviceYAML("web", 80))
	r3 := waitBusyReload(t, rec, time.Now(), &other)
	waitBusyReload(t, rec, r3, &other)
	if len(other) != 0 {
		t.Errorf("events for web: %q", other)
	}
	if log.String() != "[]" {
		t.Errorf("errors: %s", log)
	}
}

// A ConfigMap volume: every file is a link through ..data into a timestamped
// directory, and an update swaps ..data and removes the old directory (every
// file vanishes from its old real path at once). Swapped every 150 ms for 3 s
// while its busy.yaml changes: web must never be deleted.
func TestConfigMapSwaps(t *testing.T) {
	dir := t.TempDir()
	gen := 0
	writeGen := func(busyPort int) string {
		gen++
		ts := filepath.Join(dir, "..2026_"+strconv.Itoa(gen))
		if err := os.Mkdir(ts, 0o755); err != nil {
			t.Fatal(err)
		}
		writeFile(t, filepath.Join(ts, "web.yaml"), serviceYAML("web", 80))
		writeFile(t, filepath.Join(ts, "busy.yaml"), serviceYAML("busy", busyPort))
		return ts
	}
	ts := writeGen(1000)
	if err := os.Symlink(filepath.Base(ts), filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"web.yaml", "busy.yaml"} {
		if err := os.Symlink(filepath.Join("..data", f), filepath.Join(dir, f)); err != nil {
			t.Fatal(err)
		}
	}
	rec, log := startSource(t, dir, []string{"add Service default/busy", "add Service default/web"}, WithPollInterval(time.Hour))
	end := time.Now().Add(3 * time.Second)
	for i := 1001; time.Now().Before(end); i++ {
		old := ts
		ts = writeGen(i)
		tmp := filepath.Join(dir, "..data_tmp")
		if err := os.Symlink(filepath.Base(ts), tmp); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(dir, "..data")); err != nil {
			t.Fatal(err)
		}
		if err := os.RemoveAll(old); err != nil {
			t.Fatal(err)
		}
		time.Sleep(150 * time.Millisecond)
	}
	time.Sleep(1500 * time.Millisecond)
	for _, e := range rec.take() {
		if strings.Contains(e, "default/web") || strings.HasPrefix(e, "delete") || strings.HasPrefix(e, "add") {
			t.Errorf("event: %s", e)
		}
	}
	if log.String() != "[]" {
		t.Errorf("errors: %s", log)
	}
}

// README: "A file renamed to another manifest's name (mv a.yaml b.yaml)
// hands its objects to it at once". Beside a stream of writes, with another
// file deleted just before (so a re-check is armed): the atomic mv
// deletes a.yaml's Service and adds it again ~0.3 s later.
func TestAtomicMvBesideAStreamAndADeletion(t *testing.T) {
	dir := t.TempDir()
	a, b, old, busy := filepath.Join(dir, "a.yaml"), filepath.Join(dir, "b.yaml"), filepath.Join(dir, "old.yaml"), filepath.Join(dir, "busy.yaml")
	writeFile(t, a, serviceYAML("web", 80))
	writeFile(t, old, serviceYAML("old", 80))
	writeFile(t, busy, serviceYAML("busy", 1000))
	rec, _ := startSource(t, dir, []string{"add Service default/busy", "add Service default/old", "add Service default/web"}, WithPollInterval(time.Hour))
	defer rewriteEvery30ms(t, busy, "busy")()
	var other []string
	r1 := waitBusyReload(t, rec, time.Now(), &other)
	time.Sleep(time.Until(r1.Add(800 * time.Millisecond)))
	if err := os.Remove(old); err != nil { // deleted on purpose
		t.Fatal(err)
	}
	r2 := waitBusyReload(t, rec, time.Now(), &other) // finds old.yaml gone: re-check armed
	time.Sleep(time.Until(r2.Add(200 * time.Millisecond)))
	if err := os.Rename(a, b); err != nil {
		t.Fatal(err)
	}
	r3 := waitBusyReload(t, rec, time.Now(), &other)
	waitBusyReload(t, rec, r3, &other)
	for _, e := range other {
		t.Log(e)
		if strings.Contains(e, "default/web") {
			t.Errorf("event for the renamed file's Service: %s", e)
		}
	}
}
