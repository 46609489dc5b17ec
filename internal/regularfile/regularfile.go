// Package regularfile reads files from paths others can write to (a
// manifests directory, a state file): only regular files, never more than a
// cap, and without a window between the check and the read.
package regularfile

import (
	"errors"
	"fmt"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// TooLargeError is a file over the cap Read was given.
type TooLargeError struct{ Max int64 }

// ErrWouldWait is a file with nothing to read yet that has not ended:
// reading it would wait for data that may never come.
var ErrWouldWait = errors.New("nothing to read without waiting: not a file of data (a stream such as /proc/kmsg)")

func (e *TooLargeError) Error() string { return "larger than " + Size(e.Max) }

// NotRegularError is a path that opened as something other than a regular
// file (a FIFO, a device, a socket, a directory).
type NotRegularError struct{ Mode os.FileMode }

func (e *NotRegularError) Error() string {
	return fmt.Sprintf("not a regular file (%s)", typeName(e.Mode))
}

// Read returns the content of the regular file at path, at most max bytes.
// check, when not nil, vets the opened file before it is read.
//
// The file is opened non-blocking and the open descriptor is checked: a
// FIFO renamed over the path after a caller's stat blocked os.ReadFile for
// good (waiting for a writer), and a device would have been read. A plain
// regular file ignores O_NONBLOCK; one with nothing to read yet is an error
// (readAll), not a wait. The read stops at max+1 bytes whatever stat said:
// os.ReadFile allocated a sparse 1 TiB file's size and the runtime died of
// it, and a file may grow after its stat.
func Read(path string, max int64, check func(os.FileInfo) error) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0) // O_CLOEXEC: os adds it
	if err != nil {
		return nil, err
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !info.Mode().IsRegular() {
		return nil, &NotRegularError{Mode: info.Mode()}
	}
	if info.Size() > max {
		return nil, &TooLargeError{Max: max}
	}
	if check != nil {
		if err := check(info); err != nil {
			return nil, err
		}
	}
	return readAll(f, info.Size(), max)
}

// readAll reads f from where it stands to its end, at most max bytes;
// size is what stat said it holds.
//
// Each read is a read(2) of the descriptor, outside the runtime's poller:
// a file that stats as regular can still be pollable and have nothing to
// read yet (/proc/kmsg, whose messages journald took; a FUSE file), and
// os.File's Read then parked the caller until it had data, for good (the
// manifests source took no change again). Such a file is ErrWouldWait.
func readAll(f *os.File, size, max int64) ([]byte, error) {
	raw, err := f.SyscallConn()
	if err != nil {
		return nil, err
	}
	// Sized as stat says (+1 to see the end without growing), so that a
	// large file is one allocation.
	buf := make([]byte, 0, size+1)
	for {
		var n int
		var rerr error
		if err := raw.Control(func(fd uintptr) {
			for {
				n, rerr = unix.Read(int(fd), buf[len(buf):cap(buf)])
				if rerr != unix.EINTR {
					return
				}
			}
		}); err != nil {
			return nil, err
		}
		switch {
		case rerr == unix.EAGAIN:
			return nil, &os.PathError{Op: "read", Path: f.Name(), Err: ErrWouldWait}
		case rerr != nil:
			return nil, &os.PathError{Op: "read", Path: f.Name(), Err: rerr}
		case n == 0:
			return buf, nil
		}
		buf = buf[:len(buf)+n]
		if int64(len(buf)) > max {
			return nil, &TooLargeError{Max: max}
		}
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)] // grown after the stat: let append pick the size
		}
	}
}

// Size writes a byte count as the caps are given: 64 MiB.
func Size(n int64) string {
	switch {
	case n >= 1<<30 && n%(1<<30) == 0:
		return fmt.Sprintf("%d GiB", n>>30)
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%d MiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%d KiB", n>>10)
	}
	return fmt.Sprintf("%d bytes", n)
}

func typeName(m os.FileMode) string {
	switch {
	case m&os.ModeNamedPipe != 0:
		return "a named pipe"
	case m&os.ModeSocket != 0:
		return "a socket"
	case m&os.ModeCharDevice != 0:
		return "a character device"
	case m&os.ModeDevice != 0:
		return "a block device"
	case m.IsDir():
		return "a directory"
	}
	return m.Type().String()
}
