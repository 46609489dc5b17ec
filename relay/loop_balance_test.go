package relay

import (
	"errors"
	"io"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// burstAcceptor gives each client a loopHandler to the backend ep and keeps
// them, to see afterwards which loop relays each.
type burstAcceptor struct {
	ep netip.AddrPort
	mu sync.Mutex
	hs []*loopHandler
}

func (a *burstAcceptor) Accepted(int, netip.AddrPort) Handler {
	h := newLoopHandler(a.ep)
	a.mu.Lock()
	a.hs = append(a.hs, h)
	a.mu.Unlock()
	return h
}
func (a *burstAcceptor) AcceptFailed(error)            {}
func (a *burstAcceptor) Refused(netip.AddrPort, error) {}

// A burst of clients connecting at once (wrk opening its connections) is
// spread over the loops: the loop that woke first used to take nearly all
// (63 to 1 in a quarter of the trials), and a kept-alive load then ran on
// one thread.
func TestLoopsShareABurstOfClients(t *testing.T) {
	const clients = 64
	echo, err := net.ListenTCP("tcp4", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { echo.Close() })
	go func() {
		for {
			c, err := echo.Accept()
			if err != nil {
				return
			}
			go func() { _, _ = io.Copy(c, c); c.Close() }()
		}
	}()
	for round := range 3 { // before the fix, one round in four came out even by chance
		g, err := NewGroup(2, LoopOptions{})
		if err != nil {
			t.Fatal(err)
		}
		front, err := net.ListenTCP("tcp4", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
		if err != nil {
			t.Fatal(err)
		}
		addr := front.Addr().String()
		acc := &burstAcceptor{ep: echo.Addr().(*net.TCPAddr).AddrPort()}
		ln := g.Listen(dupListener(t, front), acc)

		var wg sync.WaitGroup
		var mu sync.Mutex
		var conns []net.Conn
		for range 2 { // wrk -t2
			wg.Go(func() {
				for range clients / 2 {
					c, err := net.Dial("tcp4", addr)
					if err != nil {
						t.Error(err)
						return
					}
					mu.Lock()
					conns = append(conns, c)
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		deadline := time.Now().Add(10 * time.Second)
		for {
			acc.mu.Lock()
			n := len(acc.hs)
			acc.mu.Unlock()
			if n == clients || time.Now().After(deadline) {
				break
			}
			time.Sleep(time.Millisecond)
		}
		perLoop := map[*Loop]int{}
		acc.mu.Lock()
		for _, h := range acc.hs {
			h.connected(t)
			h.mu.Lock()
			perLoop[h.conn.l]++
			h.mu.Unlock()
		}
		acc.mu.Unlock()
		counts := []int{perLoop[g.loops[0]], perLoop[g.loops[1]]}
		t.Logf("round %d: clients per loop %v", round, counts)
		for _, c := range conns {
			c.Close()
		}
		ln.Close()
		g.Close()
		if lo, hi := clients/2-int(balanceSlack(clients/2))-1, clients/2+int(balanceSlack(clients/2))+1; counts[0] < lo || counts[0] > hi {
			t.Fatalf("clients per loop %v, want each within [%d, %d]", counts, lo, hi)
		}
	}
}

// A client handed to a loop that has stopped is started by the loop that
// accepted it.
func TestLoopKeepsClientWhenLighterLoopStopped(t *testing.T) {
	b := newLoopBed(t, LoopOptions{})
	stopped := b.g.loops[1]
	stopped.post(loopCmd{op: cmdStop})
	<-stopped.done
	stopped.held.Store(-100) // the lightest by far
	for range 3 {
		h := newLoopHandler(b.ep)
		client, backend := b.connect(t, h, true)
		pass(t, client, backend, "hello")
		h.connected(t)
		h.mu.Lock()
		l := h.conn.l
		h.mu.Unlock()
		if l != b.g.loops[0] {
			t.Fatal("relayed by the stopped loop")
		}
	}
}

// A client handed over after the loop took its last commands is reset and
// its handler told, not leaked.
func TestLoopShutdownFailsClientsHandedToIt(t *testing.T) {
	l, err := newLoop(LoopOptions{})
	if err != nil {
		t.Fatal(err)
	}
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fds[1])
	h := newLoopHandler()
	l.post(loopCmd{op: cmdAdopt, fd: fds[0], h: h})
	l.shutdown()
	h.wait(t)
	if !errors.Is(h.failed, ErrLoopStopped) {
		t.Fatalf("handler told %v, want %v", h.failed, ErrLoopStopped)
	}
	if n, err := unix.Read(fds[1], make([]byte, 1)); n != 0 || (err != nil && err != unix.ECONNRESET) {
		t.Fatalf("peer read %d, %v: the adopted socket was not closed", n, err)
	}
	if l.post(loopCmd{op: cmdAdopt, fd: -1, h: h}) {
		t.Fatal("a stopped loop took a command")
	}
}
