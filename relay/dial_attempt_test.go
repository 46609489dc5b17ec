package relay

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/internal/rawio"
)

// heldDialHelper is set in the environment of the helper process of
// TestAttemptHeldPastItsTime.
const heldDialHelper = "RELAY_HELD_DIAL_HELPER"

// A dial attempt whose backend answered in time is not ended because the
// whole process was held past the attempt's time before it looked (CPU
// throttling, a paused VM). The backend, in a helper process, drops the
// dial's SYN (its accept queue is full) until the test process is
// stopped, then takes the retransmitted one (about 1 s in) and answers
// within the attempt's 1.5 s; the helper continues the test process only
// 2.5 s in. Going on, the runtime ran the poller's deadline timer before
// it polled for the connect's event, and net's dial failed with "i/o
// timeout" on a connected socket.
func TestAttemptHeldPastItsTime(t *testing.T) {
	if os.Getenv(heldDialHelper) != "" {
		heldDialBackend()
		return
	}
	if testing.Short() {
		t.Skip("stops the test process for 2.5 s")
	}
	helper := exec.Command(os.Args[0], "-test.run=^TestAttemptHeldPastItsTime$")
	helper.Env = append(os.Environ(), heldDialHelper+"=1")
	helper.Stderr = os.Stderr
	toHelper, err := helper.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	fromHelper, err := helper.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := helper.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = helper.Process.Kill()
		_ = helper.Wait()
	})
	line, err := bufio.NewReader(fromHelper).ReadString('\n')
	if err != nil {
		t.Fatalf("helper: %v", err)
	}
	backend := strings.TrimSpace(line)

	const timeout = 1500 * time.Millisecond
	d := net.Dialer{KeepAlive: -1, ControlContext: AttemptControl(DialControl(Liveness{}))}
	type result struct {
		conn net.Conn
		err  error
		took time.Duration
	}
	done := make(chan result, 1)
	start := time.Now()
	attempt := NewAttempt(timeout)
	go func() {
		c, err := d.DialContext(attempt, "tcp4", backend)
		attempt.Stop()
		done <- result{c, err, time.Since(start)}
	}()
	// Stopped once the first SYN went (and was dropped): the socket is
	// connecting.
	for connecting := false; !connecting; {
		attempt.mu.Lock()
		if attempt.socket != nil {
			_ = attempt.socket.Control(func(fd uintptr) { connecting = rawio.TCPState(int(fd)) == rawio.TCPSynSent })
		}
		attempt.mu.Unlock()
		if time.Since(start) > timeout/2 {
			t.Fatal("the dial's socket never got to SYN_SENT")
		}
		time.Sleep(time.Millisecond)
	}
	if _, err := fmt.Fprintln(toHelper, "stopping"); err != nil {
		t.Fatal(err)
	}
	_ = unix.Kill(os.Getpid(), unix.SIGSTOP) // the helper continues us
	r := <-done
	if r.err != nil {
		t.Fatalf("dial failed after %v: %v; the backend answered within the attempt's %v, the process was held past it", r.took, r.err, timeout)
	}
	defer r.conn.Close()
	_ = r.conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	got, err := io.ReadAll(r.conn)
	if string(got) != "answered\n" || err != nil {
		t.Fatalf("read %q, %v from the backend", got, err)
	}
}

// stopped tells whether process pid is stopped (state T in its stat).
func stopped(pid int) bool {
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	// pid (comm) state ...: comm may hold spaces and parentheses.
	rest := stat[strings.LastIndexByte(string(stat), ')')+1:]
	return len(rest) > 1 && rest[1] == 'T'
}

// heldDialBackend is the helper process of TestAttemptHeldPastItsTime.
func heldDialBackend() {
	parent := os.Getppid()
	// Never leave the test process stopped.
	defer func() { _ = unix.Kill(parent, unix.SIGCONT) }()
	time.AfterFunc(20*time.Second, func() {
		_ = unix.Kill(parent, unix.SIGCONT)
		os.Exit(1)
	})
	fail := func(err error) {
		fmt.Fprintln(os.Stderr, "held dial helper:", err)
		_ = unix.Kill(parent, unix.SIGCONT)
		os.Exit(1)
	}
	// A listener with a full accept queue (backlog 0, one queued
	// connection): SYNs are dropped until a slot frees.
	ln, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		fail(err)
	}
	if err := unix.Bind(ln, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		fail(err)
	}
	if err := unix.Listen(ln, 0); err != nil {
		fail(err)
	}
	ep, err := rawio.LocalAddr(ln)
	if err != nil {
		fail(err)
	}
	queued, err := net.DialTimeout("tcp4", ep.String(), 5*time.Second)
	if err != nil {
		fail(err)
	}
	defer queued.Close()
	fmt.Println(ep.String())
	if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil {
		fail(err)
	}
	start := time.Now() // the attempt began before
	for !stopped(parent) {
		if time.Since(start) > 5*time.Second {
			fail(errors.New("the test process never stopped"))
		}
		time.Sleep(time.Millisecond)
	}
	// Free the slot: the SYN retransmitted about 1 s after the first is
	// answered by the kernel, within the attempt's 1.5 s.
	first, _, err := unix.Accept4(ln, unix.SOCK_CLOEXEC)
	if err != nil {
		fail(err)
	}
	defer unix.Close(first)
	dialled, _, err := unix.Accept4(ln, unix.SOCK_CLOEXEC)
	if err != nil {
		fail(err)
	}
	if _, err := unix.Write(dialled, []byte("answered\n")); err != nil {
		fail(err)
	}
	_ = unix.Shutdown(dialled, unix.SHUT_WR)
	// The hold: past the attempt's time (1.5 s from before start).
	time.Sleep(max(2*time.Second-time.Since(start), 0))
	if err := unix.Kill(parent, unix.SIGCONT); err != nil {
		fail(errors.New("SIGCONT: " + err.Error()))
	}
	time.Sleep(5 * time.Second) // the test kills it
	unix.Close(dialled)
}

// An attempt whose connect gets no answer ends at its time, as with a
// deadline, and one whose endpoint refuses ends with the refusal.
func TestAttemptEndsAtItsTime(t *testing.T) {
	d := net.Dialer{KeepAlive: -1, ControlContext: AttemptControl(DialControl(Liveness{}))}
	const timeout = 200 * time.Millisecond
	silent := silentBackend(t).String()
	start := time.Now()
	attempt := NewAttempt(timeout)
	c, err := d.DialContext(attempt, "tcp4", silent)
	attempt.Stop()
	took := time.Since(start)
	if err == nil {
		c.Close()
		t.Fatal("a dial to a listener that drops SYNs connected")
	}
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() || took < timeout || took > 5*timeout {
		t.Fatalf("dial ended after %v with %v; want a timeout at %v", took, err, timeout)
	}
	attempt = NewAttempt(time.Second)
	_, err = d.DialContext(attempt, "tcp4", closedPort(t).String())
	attempt.Stop()
	if !errors.Is(err, unix.ECONNREFUSED) {
		t.Fatalf("dial to a closed port: %v, want ECONNREFUSED", err)
	}
}

// deadlineOnly is the context the proxier's goroutine relay dialled with
// before Attempt: the attempt's deadline and nothing else, the poller's
// write deadline on the connecting socket (no timer of its own).
type deadlineOnly time.Time

var deadlineNeverDone = make(chan struct{})

func (d deadlineOnly) Deadline() (time.Time, bool) { return time.Time(d), true }
func (deadlineOnly) Done() <-chan struct{}         { return deadlineNeverDone }
func (deadlineOnly) Err() error                    { return nil }
func (deadlineOnly) Value(any) any                 { return nil }
func (deadlineOnly) AfterFunc(func()) func() bool  { return func() bool { return true } }

// BenchmarkDialAttempt is one loopback dial (and close) with the
// goroutine relay's dialer: "deadline" with the deadline-only context it
// used before, "attempt" with an Attempt.
func BenchmarkDialAttempt(b *testing.B) {
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	addr := ln.Addr().String()
	d := net.Dialer{KeepAlive: -1, ControlContext: AttemptControl(DialControl(Liveness{}))}
	for _, tc := range []struct {
		name string
		dial func() (net.Conn, error)
	}{
		{"deadline", func() (net.Conn, error) {
			return d.DialContext(deadlineOnly(time.Now().Add(time.Second)), "tcp4", addr)
		}},
		{"attempt", func() (net.Conn, error) {
			a := NewAttempt(time.Second)
			c, err := d.DialContext(a, "tcp4", addr)
			a.Stop()
			return c, err
		}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			b.ReportAllocs()
			cpu := processCPU()
			defer func() { reportCPU(b, cpu) }()
			for b.Loop() {
				c, err := tc.dial()
				if err != nil {
					b.Fatal(err)
				}
				c.Close()
			}
		})
	}
}

// An AfterFunc registered once the attempt is over runs at once: net's
// connect registers its wake-up when it starts waiting, which may be just
// after the time ran out (expire had found no wake-up to call); without
// it the dial waited for the kernel's own timeout, minutes.
func TestAttemptAfterFuncOnceOver(t *testing.T) {
	a := NewAttempt(0)
	defer a.Stop()
	<-a.Done()
	called := make(chan struct{})
	a.AfterFunc(func() { close(called) })
	select {
	case <-called:
	case <-time.After(10 * time.Second):
		t.Fatal("an AfterFunc registered after the attempt ended was never called")
	}
	if a.Err() == nil {
		t.Error("an ended attempt has no Err")
	}
}
