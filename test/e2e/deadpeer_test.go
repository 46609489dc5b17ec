package e2e

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/test/harness/netns"
)

// Dead-peer flags of TestDeadPeers: an idle peer is probed after 1 s and
// given up 3 s after it last answered (the user timeout decides, as the
// kernel does when both are set); unacknowledged data also ends at 3 s.
var deadPeerFlags = []string{"--tcp-keepalive-idle=1s", "--tcp-keepalive-interval=1s",
	"--tcp-keepalive-count=2", "--tcp-user-timeout=3s"}

// deadPeerBound is how soon after its peer vanished the proxy must have
// released a connection: the 3 s timeout plus a probe interval and slack
// for a loaded runner.
const deadPeerBound = 8 * time.Second

// TestDeadPeers cuts one side of a proxied connection off for good (its
// packets dropped inside its own namespace, its socket closed, so no FIN or
// reset ever leaves: a host that died or lost its link) and wants the proxy
// to find out by itself: the other side gets a reset and the proxy holds
// neither descriptor any more. Before keep-alive and TCP_USER_TIMEOUT on
// the proxied sockets, such connections were held forever (the soak's
// dead-peer growth).
func TestDeadPeers(t *testing.T) {
	requireSuite(t)
	c := netns.NewCluster(t, netns.ClusterOptions{Backends: 2, ClientIPsEach: 4})
	// Our own echo listeners stand in for the backends, so the test sees
	// how the backend side of each connection ends.
	backends := make([]*echoBackend, len(c.BackendIPs))
	for i, a := range c.BackendIPs {
		backends[i] = startEchoBackend(t, c.Backends, netip.AddrPortFrom(a, backendPort))
	}
	p := newProxy(t, c, deadPeerFlags...)
	svcs := []svc{
		{name: "dp-idle", clusterIP: "10.96.7.10", endpoints: ips(c, 0)},
		{name: "dp-busy", clusterIP: "10.96.7.11", endpoints: ips(c, 0)},
		{name: "dp-backend", clusterIP: "10.96.7.12", endpoints: ips(c, 1)},
	}
	for _, s := range svcs {
		writeSvc(t, p.dir, s)
	}
	p.Start(t, startWithin)
	for _, s := range svcs {
		waitEcho(t, c.Pod1, c.Pod1IPs[3], s.tcp())
	}
	time.Sleep(500 * time.Millisecond) // the probes' connections close
	for _, b := range backends {
		b.drain()
	}
	fdsBefore := countFDs(t, p.Proc.Pid)

	t.Run("IdleClientVanishes", func(t *testing.T) {
		src := c.Pod1IPs[0]
		cl := dialEchoed(t, c.Pod1, src, svcs[0].tcp())
		bc := backends[0].next(t)
		cut(t, c.Pod1, src)
		cl.Close() // its FIN never leaves
		took := wantReset(t, "backend", bc, nil)
		figure(t, "idle client vanished: backend reset after %v (keep-alive 1s/1s, user timeout 3s)", took.Round(100*time.Millisecond))
		wantNotHeld(t, c.Node, src)
	})
	t.Run("ClientVanishesWithDataInFlight", func(t *testing.T) {
		src := c.Pod1IPs[1]
		cl := dialEchoed(t, c.Pod1, src, svcs[1].tcp())
		bc := backends[0].next(t)
		cut(t, c.Pod1, src)
		cl.Close()
		// The backend keeps talking: its bytes reach the proxy, whose copy
		// to the client is never acknowledged (the user timeout's case).
		took := wantReset(t, "backend", bc, []byte("more for a client that is gone\n"))
		figure(t, "client vanished with data in flight: backend reset after %v", took.Round(100*time.Millisecond))
		wantNotHeld(t, c.Node, src)
	})
	t.Run("BackendVanishes", func(t *testing.T) {
		src := c.Pod1IPs[2]
		cl := dialEchoed(t, c.Pod1, src, svcs[2].tcp())
		bc := backends[1].next(t)
		cut(t, c.Backends, c.BackendIPs[1])
		bc.Close()
		took := wantReset(t, "client", cl, nil)
		figure(t, "backend vanished: client reset after %v", took.Round(100*time.Millisecond))
		wantNotHeld(t, c.Node, c.BackendIPs[1])
	})
	if t.Failed() {
		return
	}
	// Both descriptors of every connection are gone.
	deadline := time.Now().Add(3 * time.Second)
	for {
		fds := countFDs(t, p.Proc.Pid)
		if fds <= fdsBefore {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("proxy holds %d descriptors, %d before the three connections", fds, fdsBefore)
		}
		time.Sleep(100 * time.Millisecond)
	}
	p.RequireRunning(t)
}

// echoBackend accepts connections in the backends namespace, echoes each,
// and hands each accepted connection to the test.
type echoBackend struct {
	conns chan *net.TCPConn
}

func startEchoBackend(t *testing.T, ns *netns.NS, addr netip.AddrPort) *echoBackend {
	t.Helper()
	ln, err := ns.ListenTCP(addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	b := &echoBackend{conns: make(chan *net.TCPConn, 16)}
	go func() {
		for {
			c, err := ln.AcceptTCP()
			if err != nil {
				return
			}
			// Echo the first line (the handshake of dialEchoed); the
			// rest belongs to the test.
			buf := make([]byte, 64)
			_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
			n, err := c.Read(buf)
			_ = c.SetReadDeadline(time.Time{})
			if err == nil {
				_, _ = c.Write(buf[:n])
			}
			select {
			case b.conns <- c:
			default:
				c.Close() // a probe nobody waits for
			}
		}
	}()
	return b
}

// drain closes the connections accepted so far (the start-up probes').
func (b *echoBackend) drain() {
	for {
		select {
		case c := <-b.conns:
			c.Close()
		default:
			return
		}
	}
}

// next is the backend side of the connection dialEchoed just made.
func (b *echoBackend) next(t *testing.T) *net.TCPConn {
	t.Helper()
	select {
	case c := <-b.conns:
		t.Cleanup(func() { c.Close() })
		return c
	case <-time.After(5 * time.Second):
		t.Fatal("backend accepted nothing")
		return nil
	}
}

// waitEcho waits until the Service answers the echo from src.
func waitEcho(t *testing.T, ns *netns.NS, src netip.Addr, dst netip.AddrPort) {
	t.Helper()
	deadline := time.Now().Add(startWithin)
	for {
		c, err := echoOnce(ns, src, dst)
		if err == nil {
			c.Close()
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not served from %s: %v", dst, src, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func echoOnce(ns *netns.NS, src netip.Addr, dst netip.AddrPort) (*net.TCPConn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	c, err := ns.DialTCP(ctx, src, dst)
	if err != nil {
		return nil, err
	}
	msg := []byte("hello " + src.String() + "\n")
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := c.Write(msg); err != nil {
		c.Close()
		return nil, err
	}
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(c, got); err != nil || string(got) != string(msg) {
		c.Close()
		return nil, fmt.Errorf("echo %q: %v", got, err)
	}
	_ = c.SetDeadline(time.Time{})
	return c, nil
}

// dialEchoed opens a proxied connection from src and checks it carries an
// echo, so both of its sockets are established at the proxy.
func dialEchoed(t *testing.T, ns *netns.NS, src netip.Addr, dst netip.AddrPort) *net.TCPConn {
	t.Helper()
	c, err := echoOnce(ns, src, dst)
	if err != nil {
		t.Fatalf("connection from %s to %s: %v", src, dst, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// cut drops every packet to and from addr inside ns, for good.
func cut(t *testing.T, ns *netns.NS, addr netip.Addr) {
	t.Helper()
	a := addr.String()
	ns.MustExec("iptables", "-w", "-I", "OUTPUT", "-s", a, "-j", "DROP")
	ns.MustExec("iptables", "-w", "-I", "INPUT", "-d", a, "-j", "DROP")
}

// wantReset waits (after writing say, if any) until c's peer, the proxy,
// resets it, within deadPeerBound, and returns how long that took.
func wantReset(t *testing.T, name string, c *net.TCPConn, say []byte) time.Duration {
	t.Helper()
	start := time.Now()
	if say != nil {
		if _, err := c.Write(say); err != nil {
			t.Fatalf("%s write: %v", name, err)
		}
	}
	_ = c.SetReadDeadline(start.Add(deadPeerBound))
	_, err := io.Copy(io.Discard, c)
	took := time.Since(start)
	switch {
	case errors.Is(err, os.ErrDeadlineExceeded):
		t.Fatalf("%s: the proxy still holds the connection %v after its peer vanished", name, deadPeerBound)
	case !errors.Is(err, syscall.ECONNRESET):
		t.Fatalf("%s: connection ended with %v after %v; want a reset", name, err, took)
	}
	return took
}

// wantNotHeld checks the proxy's namespace has no connection to peer left.
func wantNotHeld(t *testing.T, node *netns.NS, peer netip.Addr) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Second)
	for {
		out, err := node.Exec("ss", "-Htn", "dst", peer.String())
		if err != nil {
			t.Fatal(err)
		}
		if strings.TrimSpace(out) == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the proxy still has sockets to %s:\n%s", peer, out)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func countFDs(t *testing.T, pid int) int {
	t.Helper()
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		t.Fatal(err)
	}
	return len(fds)
}
