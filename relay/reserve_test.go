package relay

import (
	"errors"
	"net"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/internal/rawio"
)

// lowCeiling puts the descriptor ceiling at n for the test. Not parallel:
// the ceiling is the process's.
func lowCeiling(t *testing.T, n int) {
	t.Helper()
	old := descriptorCeiling.Load()
	SetDescriptorCeiling(n)
	t.Cleanup(func() {
		descriptorCeiling.Store(old)
		pipes.unsqueeze() // the ceiling's descriptors squeezed the pool
	})
}

// A client accepted into the descriptor reserve is reset at once and
// reported, never handed a Handler: before, the loops relayed clients
// until accept failed with EMFILE, and the proxy's own servers, rule
// writes and manifests had no descriptor left.
func TestLoopRefusesClientInReserve(t *testing.T) {
	b := newLoopBed(t, LoopOptions{})
	lowCeiling(t, 1)               // every descriptor is the reserve's
	b.next <- newLoopHandler(b.ep) // what a client accepted would get
	// The reset may beat the end of the client's connect.
	c, err := net.DialTCP("tcp4", nil, net.TCPAddrFromAddrPort(b.front))
	if err == nil {
		defer c.Close()
		expectReset(t, c)
	} else if !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("connect: %v, want a reset", err)
	}
	select {
	case err := <-b.refused:
		if !errors.Is(err, ErrDescriptorReserve) || !LocalShortage(err) {
			t.Fatalf("refused with %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the refusal was not reported")
	}

	<-b.next // not taken

	// Below the ceiling, a client is served.
	SetDescriptorCeiling(1 << 30)
	h := newLoopHandler(b.ep)
	client, backend := b.connect(t, h, true)
	pass(t, client, backend, "served")
}

// A backend socket opened into the reserve fails the connection at once as
// a local shortage: closed, no endpoint blamed.
func TestLoopBackendSocketInReserve(t *testing.T) {
	b := newLoopBed(t, LoopOptions{DialTimeouts: []time.Duration{time.Second, time.Second}})
	lowCeiling(t, 1<<30)
	newSocket = func(family int) (int, error) {
		fd, err := rawio.Socket(family)
		if err == nil {
			SetDescriptorCeiling(fd) // this one is the first of the reserve
		}
		return fd, err
	}
	t.Cleanup(func() { newSocket = rawio.Socket })
	dialFails, failed := refusedClient(t, b, newLoopHandler(b.ep, b.ep))
	if len(dialFails) != 0 || !errors.Is(failed, ErrDescriptorReserve) {
		t.Fatalf("dial failures %v, failed %v; want none blamed and ErrDescriptorReserve", dialFails, failed)
	}
}

// The goroutine relay's dialers refuse a backend socket in the reserve
// (net closes it); listening sockets are the descriptor budget's, not the
// ceiling's.
func TestDialControlRefusesReserve(t *testing.T) {
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	controls := map[string]*net.Dialer{
		"DialControl":    {Control: DialControl(Liveness{})},
		"BackendControl": {Control: BackendControl(Liveness{})},
	}
	for name, d := range controls {
		t.Run(name, func(t *testing.T) {
			lowCeiling(t, 1)
			c, err := d.Dial("tcp4", ln.Addr().String())
			if err == nil {
				c.Close()
			}
			if !errors.Is(err, ErrDescriptorReserve) || !LocalShortage(err) {
				t.Fatalf("dial in the reserve: %v, want ErrDescriptorReserve", err)
			}
			SetDescriptorCeiling(1 << 30)
			c, err = d.Dial("tcp4", ln.Addr().String())
			if err != nil {
				t.Fatalf("dial below the ceiling: %v", err)
			}
			c.Close()
		})
	}
	lowCeiling(t, 1)
	l, err := (&net.ListenConfig{Control: SocketControl(Liveness{})}).Listen(t.Context(), "tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	l.Close()
}

func TestConnInReserve(t *testing.T) {
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, err := net.Dial("tcp4", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for _, tt := range []struct {
		ceiling int
		want    bool
	}{{0, false}, {1, true}, {1 << 30, false}} {
		lowCeiling(t, tt.ceiling)
		if got := ConnInReserve(c.(*net.TCPConn)); got != tt.want {
			t.Errorf("ceiling %d: in reserve %v, want %v", tt.ceiling, got, tt.want)
		}
	}
}

// A new splice pipe in the reserve is given back as EMFILE, so the
// connection stays buffered (as when pipe2 finds no descriptor); before, the
// pool's pipes (up to 512 descriptors idle) took from the reserve too.
func TestPipeInReserve(t *testing.T) {
	pool := &pipePool{max: 1}
	lowCeiling(t, 1)
	if pp, err := pool.get(); err != unix.EMFILE || !isPipeShortage(err) {
		pool.put(pp, false)
		t.Fatalf("pipe in the reserve: %v, want EMFILE", err)
	}
	SetDescriptorCeiling(1 << 30)
	pp, err := pool.get()
	if err != nil {
		t.Fatal(err)
	}
	pool.put(pp, false)
}

// nextPipeFD is the higher descriptor a pipe opened now would get.
func nextPipeFD(t *testing.T) int {
	t.Helper()
	var fds [2]int
	if err := unix.Pipe2(fds[:], unix.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	unix.Close(fds[0])
	unix.Close(fds[1])
	return max(fds[0], fds[1])
}

// A splice pipe is an optional speed-up: one that would take a descriptor
// in the top eighth below the ceiling is not opened (the connection copies
// through its buffer), so the last descriptors go to clients. Before, pipes
// took any descriptor below the ceiling, and a burst of 400 streaming
// clients under a 1,024 limit had 83-115 refused while pipes held the
// descriptors their sockets needed.
func TestPipeNotTakenNearCeiling(t *testing.T) {
	pool := &pipePool{max: 4, idle: time.Hour}
	fd := nextPipeFD(t)
	lowCeiling(t, fd+1) // the pipe's last descriptor is the last below the ceiling
	if fd+1 < 8 {
		t.Skipf("descriptor %d: no eighth to keep", fd)
	}
	if pp, err := pool.get(); err == nil || !isPipeShortage(err) {
		pool.put(pp, false)
		t.Fatalf("pipe at %d with the ceiling at %d: %v, want EMFILE", fd, fd+1, err)
	}
}

// Once a connection's descriptor comes near the ceiling, the pool closes
// its idle pipes, closes the ones given back, and opens none for a while:
// live connections go on buffered, and the descriptors go to clients.
// Before, up to 256 idle pipes (512 descriptors) stayed pooled whatever the
// clients lacked.
func TestPipesSqueezedNearCeiling(t *testing.T) {
	lowCeiling(t, 1<<30)
	var held []pipePair
	for range 3 {
		pp, err := pipes.get()
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, pp)
	}
	pipes.put(held[0], true)
	pipes.put(held[1], true)
	SetDescriptorCeiling(800)
	if InReserve(750) {
		t.Fatal("750 is below the ceiling of 800")
	}
	pipes.mu.Lock()
	idle := len(pipes.free)
	pipes.mu.Unlock()
	if idle != 0 {
		t.Errorf("%d idle pipes kept with the ceiling near", idle)
	}
	for _, fd := range []int{held[0].r, held[0].w, held[1].r, held[1].w} {
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); err != unix.EBADF {
			t.Errorf("idle pipe descriptor %d still open", fd)
		}
	}
	pipes.put(held[2], true)
	if _, err := unix.FcntlInt(uintptr(held[2].r), unix.F_GETFD, 0); err != unix.EBADF {
		t.Errorf("a pipe given back with the ceiling near was pooled")
	}
	descriptorCeiling.Store(1 << 30) // the squeeze goes on
	if pp, err := pipes.get(); err == nil || !isPipeShortage(err) {
		pipes.put(pp, false)
		t.Fatalf("new pipe just after the ceiling came near: %v, want EMFILE", err)
	}
}

// Idle pooled pipes are closed once unused for the pool's idle time, with
// no traffic to trigger it; before, a burst's pipes stayed pooled for good
// (29-111 descriptors after a burst of 400 clients).
func TestPipePoolTrimsIdle(t *testing.T) {
	pool := &pipePool{max: 4, idle: 100 * time.Millisecond}
	a, err := pool.get()
	if err != nil {
		t.Fatal(err)
	}
	b, err := pool.get()
	if err != nil {
		t.Fatal(err)
	}
	pool.put(a, true)
	time.Sleep(60 * time.Millisecond)
	pool.put(b, true) // used 60 ms later: closed 60 ms after a
	bPut := time.Now()
	closed := func(pp pipePair) bool {
		_, err := unix.FcntlInt(uintptr(pp.r), unix.F_GETFD, 0)
		return err == unix.EBADF
	}
	time.Sleep(80 * time.Millisecond)
	// b must still be open only if this goroutine woke before b's idle
	// time was up (a loaded runner overslept it in 1 of 20 runs).
	bDue := time.Since(bPut) >= pool.idle
	if !closed(a) || (closed(b) && !bDue) {
		t.Fatalf("140 ms on: first pipe closed %v (want true), second %v (want false)", closed(a), closed(b))
	}
	time.Sleep(200 * time.Millisecond)
	pool.mu.Lock()
	idle := len(pool.free)
	pool.mu.Unlock()
	if idle != 0 || !closed(b) {
		t.Fatalf("%d pipes still pooled after their idle time", idle)
	}
}
