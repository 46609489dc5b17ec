package relay

import (
	"fmt"
	"net/netip"
	"testing"

	"golang.org/x/sys/unix"
)

// refuseAll is an Acceptor that never sees a client.
type refuseAll struct{}

func (refuseAll) Accepted(fd int, _ netip.AddrPort) Handler { unix.Close(fd); return nil }
func (refuseAll) AcceptFailed(error)                        {}
func (refuseAll) Refused(netip.AddrPort, error)             {}

// listeningSocket is a non-blocking TCP socket listening on a free
// loopback port.
func listeningSocket(tb testing.TB) int {
	tb.Helper()
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		tb.Fatal(err)
	}
	if err := unix.Bind(fd, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		unix.Close(fd)
		tb.Fatal(err)
	}
	if err := unix.Listen(fd, 16); err != nil {
		unix.Close(fd)
		tb.Fatal(err)
	}
	return fd
}

// BenchmarkListenClose is one service port opened and closed on a loop
// group that already serves held others, as a sync does when one Service
// comes and goes on a big node (and, held times over, when many do: a
// restart, a namespace deleted). Its cost must not grow with held.
func BenchmarkListenClose(b *testing.B) {
	for _, held := range []int{0, 1000, 10000} {
		b.Run(fmt.Sprintf("held=%d", held), func(b *testing.B) {
			g, err := NewGroup(2, LoopOptions{})
			if err != nil {
				b.Fatal(err)
			}
			defer g.Close()
			lns := make([]*Listener, 0, held)
			for range held {
				lns = append(lns, g.Listen(listeningSocket(b), refuseAll{}))
			}
			defer func() {
				for _, ln := range lns {
					ln.Close()
				}
			}()
			// The held ones are registered before the clock starts.
			g.Listen(listeningSocket(b), refuseAll{}).Close()
			b.ResetTimer()
			for range b.N {
				// bind(0) searches the port space linearly: not ours.
				b.StopTimer()
				fd := listeningSocket(b)
				b.StartTimer()
				g.Listen(fd, refuseAll{}).Close()
			}
		})
	}
}

// BenchmarkListenCloseAll is a node's worth of service ports opened and
// then closed in a row (the first sync, then every Service deleted).
func BenchmarkListenCloseAll(b *testing.B) {
	const ports = 10000
	g, err := NewGroup(2, LoopOptions{})
	if err != nil {
		b.Fatal(err)
	}
	defer g.Close()
	fds := make([]int, ports)
	lns := make([]*Listener, ports)
	for range b.N {
		b.StopTimer()
		for i := range fds {
			fds[i] = listeningSocket(b)
		}
		b.StartTimer()
		for i, fd := range fds {
			lns[i] = g.Listen(fd, refuseAll{})
		}
		for _, ln := range lns {
			ln.Close()
		}
	}
}
