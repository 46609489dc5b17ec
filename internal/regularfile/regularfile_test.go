package regularfile

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestRead(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, n int) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(strings.Repeat("a", n)), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	sparse := write("sparse", 0)
	if err := os.Truncate(sparse, 1<<40); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, path string
		wantLen    int
		wantErr    string
	}{
		{"empty", write("empty", 0), 0, ""},
		{"at the cap", write("at", 1024), 1024, ""},
		{"over the cap", write("over", 1025), 0, "larger than 1 KiB"},
		{"sparse 1 TiB", sparse, 0, "larger than 1 KiB"},
		{"fifo", fifo, 0, "not a regular file (a named pipe)"},
		{"directory", dir, 0, "not a regular file (a directory)"},
		{"device", "/dev/zero", 0, "not a regular file (a character device)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			data, err := Read(tc.path, 1024, nil)
			if tc.wantErr == "" {
				if err != nil || len(data) != tc.wantLen {
					t.Errorf("got %d bytes, %v; want %d bytes", len(data), err, tc.wantLen)
				}
				return
			}
			if err == nil || err.Error() != tc.wantErr {
				t.Errorf("error %v, want %q", err, tc.wantErr)
			}
		})
	}
}

func TestReadCheck(t *testing.T) {
	p := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(p, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	refused := errors.New("refused")
	if _, err := Read(p, 10, func(os.FileInfo) error { return refused }); err != refused {
		t.Errorf("error %v, want the check's", err)
	}
}

// TestReadNeverWaits: a file that stats as regular can still have nothing
// to read yet (/proc/kmsg once its messages were taken, a FUSE file); the
// read must say so at once, not wait for data that may never come (the
// manifests source took no change again). A pipe stands in for such a
// file here: reading /proc/kmsg would take the host's kernel messages.
func TestReadNeverWaits(t *testing.T) {
	r, w, err := os.Pipe() // pollable, in the runtime's poller, as an opened /proc/kmsg
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	if _, err := w.WriteString("partial"); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := readAll(r, 0, 1024)
		done <- err
	}()
	select {
	case err := <-done:
		if !errors.Is(err, ErrWouldWait) {
			t.Errorf("error %v, want %v", err, ErrWouldWait)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the read of a file with nothing more to read did not return within 5 s: it waits for data")
	}
}
