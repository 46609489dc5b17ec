package rawio

import (
	"errors"
	"fmt"
	"testing"

	"golang.org/x/sys/unix"
)

// batch points n headers at n buffers of size bytes each.
func batch(n, size int) ([]Mmsghdr, [][]byte) {
	msgs := make([]Mmsghdr, n)
	bufs := make([][]byte, n)
	iovs := make([]unix.Iovec, n)
	for i := range msgs {
		bufs[i] = make([]byte, size)
		iovs[i].Base = &bufs[i][0]
		iovs[i].SetLen(size)
		msgs[i].Hdr.Iov = &iovs[i]
		msgs[i].Hdr.SetIovlen(1)
	}
	return msgs, bufs
}

func TestRecvmmsgSendmmsg(t *testing.T) {
	a, b := socketPair(t, unix.SOCK_DGRAM)
	in, inBufs := batch(4, 64)
	if _, err := Recvmmsg(b, in); !errors.Is(err, unix.EAGAIN) {
		t.Fatalf("recvmmsg with nothing queued: %v, want EAGAIN", err)
	}
	if n, err := Recvmmsg(b, nil); n != 0 || err != nil {
		t.Fatalf("recvmmsg of no message: %d, %v", n, err)
	}

	out, outBufs := batch(6, 64)
	for i := range out {
		n := copy(outBufs[i], fmt.Sprintf("datagram %d", i))
		out[i].Hdr.Iov.SetLen(n)
	}
	if n, err := Sendmmsg(a, out); n != len(out) || err != nil {
		t.Fatalf("sendmmsg: %d, %v; want %d sent", n, err, len(out))
	}
	// Six queued, four slots: a full batch, then the two left, each
	// with its own length.
	next := 0
	for _, want := range []int{4, 2} {
		n, err := Recvmmsg(b, in)
		if n != want || err != nil {
			t.Fatalf("recvmmsg: %d, %v; want %d", n, err, want)
		}
		for i := range n {
			got := string(inBufs[i][:in[i].Len])
			if w := fmt.Sprintf("datagram %d", next); got != w {
				t.Fatalf("message %d: %q, want %q", i, got, w)
			}
			next++
		}
	}
	if _, err := Recvmmsg(b, in); !errors.Is(err, unix.EAGAIN) {
		t.Fatalf("recvmmsg after the queue emptied: %v, want EAGAIN", err)
	}
}

// An error on the first message of a batch is the call's error; the
// messages are not taken.
func TestSendmmsgFirstMessageError(t *testing.T) {
	a, _ := socketPair(t, unix.SOCK_DGRAM)
	if err := unix.Shutdown(a, unix.SHUT_WR); err != nil {
		t.Fatal(err)
	}
	out, _ := batch(2, 8)
	if n, err := Sendmmsg(a, out); n != 0 || !errors.Is(err, unix.EPIPE) {
		t.Fatalf("sendmmsg on a socket shut for writing: %d, %v; want EPIPE", n, err)
	}
}

func TestSendmsg(t *testing.T) {
	a, b := socketPair(t, unix.SOCK_DGRAM)
	one, two := []byte("one "), []byte("datagram")
	iov := []unix.Iovec{{Base: &one[0]}, {Base: &two[0]}}
	iov[0].SetLen(len(one))
	iov[1].SetLen(len(two))
	hdr := unix.Msghdr{Iov: &iov[0]}
	hdr.SetIovlen(2)
	if n, err := Sendmsg(a, &hdr); n != len(one)+len(two) || err != nil {
		t.Fatalf("sendmsg: %d, %v", n, err)
	}
	buf := make([]byte, 64)
	n, err := unix.Read(b, buf)
	if err != nil || string(buf[:n]) != "one datagram" {
		t.Fatalf("read %q, %v; want the iovecs as one datagram", buf[:n], err)
	}
}
