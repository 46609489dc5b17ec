package rawio

import (
	"testing"

	"golang.org/x/sys/unix"
)

// PollOut says POLLOUT while a socket has room, nothing once its send
// buffer is full, and POLLHUP once its peer is gone.
func TestPollOut(t *testing.T) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_NONBLOCK, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fds[0])
	if ev, err := PollOut(fds[0]); err != nil || ev&unix.POLLOUT == 0 {
		t.Fatalf("an empty socket: events %#x, %v; want POLLOUT", ev, err)
	}
	chunk := make([]byte, 64<<10)
	for {
		if _, err := unix.Write(fds[0], chunk); err != nil {
			break // EAGAIN: full
		}
	}
	if ev, err := PollOut(fds[0]); err != nil || ev != 0 {
		t.Fatalf("a full socket: events %#x, %v; want none", ev, err)
	}
	unix.Close(fds[1])
	if ev, err := PollOut(fds[0]); err != nil || ev&unix.POLLHUP == 0 {
		t.Fatalf("a socket whose peer closed: events %#x, %v; want POLLHUP", ev, err)
	}
}
