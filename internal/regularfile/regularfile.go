// Package regularfile reads files from paths others can write to (a
// manifests directory, a state file): only regular files, never more than a
// cap, and without a window between the check and the read.
package regularfile

import (
	"fmt"
	"io"
	"os"
	"syscall"
)

// TooLargeError is a file over the cap Read was given.
type TooLargeError struct{ Max int64 }

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
// good (waiting for a writer), and a device would have been read. A regular
// file ignores O_NONBLOCK. The read stops at max+1 bytes whatever stat said:
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
	// Sized as stat says (+1 to see the end without growing), so that a
	// large file is one allocation.
	buf := make([]byte, 0, info.Size()+1)
	for {
		n, err := f.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if int64(len(buf)) > max {
			return nil, &TooLargeError{Max: max}
		}
		if err == io.EOF {
			return buf, nil
		}
		if err != nil {
			return nil, err
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
