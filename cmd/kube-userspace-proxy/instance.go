package main

import (
	"errors"
	"net"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	"k8s.io/client-go/util/flowcontrol"
	"k8s.io/klog/v2"
)

// instanceSocket is the abstract unix socket a proxy that programs rules
// listens on for its life, so that a second one on the same node can say
// that the two will rewrite each other's chains (neither knows the
// other's ports). An abstract name belongs to the network namespace, as
// the rules do: proxies in other namespaces (tests, the demo) never meet
// it; and it goes with the process, so a crash leaves nothing stale.
var instanceSocket = "@kube-userspace-proxy.rules"

// instanceClaim is this process's hold on instanceSocket, or its wait for
// it: a process that found another holding it takes the name once that
// one is gone, so that a third still finds a proxy (a rolling restart
// overlaps the old and the new one; the new one stays).
type instanceClaim struct {
	// instanceSocket, instanceRetryEvery and newInstanceLogLimiter as
	// they were at the claim (its wait runs on).
	name       string
	retryEvery time.Duration
	newLimiter func() flowcontrol.RateLimiter

	mu       sync.Mutex
	ln       *net.UnixListener // nil while another process holds the name
	released bool
	// onTakeOver is called once the other process is gone (OnTakeOver).
	onTakeOver func()
	done       chan struct{} // closed by release: the wait ends
}

// instanceRetryEvery is how often a process waiting for instanceSocket
// tries to take it (a variable: tests shorten it).
var instanceRetryEvery = 5 * time.Second

// claimInstance takes instanceSocket, or reports that another process
// holds it (held) and, when this process can see it, that one's PID, and
// then waits for it to be free. The holder logs each process that finds
// it. release ends the hold or the wait.
func claimInstance() (claim *instanceClaim, held bool, pid int) {
	c := &instanceClaim{name: instanceSocket, retryEvery: instanceRetryEvery, newLimiter: newInstanceLogLimiter,
		done: make(chan struct{})}
	err := c.listen()
	if err == nil {
		return c, false, 0
	}
	if !errors.Is(err, syscall.EADDRINUSE) {
		klog.V(2).InfoS("Cannot watch for a second proxy on this node", "err", err)
		return c, false, 0
	}
	held, pid = holder()
	go c.takeOverWhenFree()
	return c, held, pid
}

// listen takes the name, unless the claim was released.
func (c *instanceClaim) listen() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.released {
		return net.ErrClosed
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: c.name, Net: "unix"})
	if err != nil {
		return err
	}
	c.ln = ln
	go announceOthers(ln, c.newLimiter())
	return nil
}

func (c *instanceClaim) takeOverWhenFree() {
	tick := time.NewTicker(c.retryEvery)
	defer tick.Stop()
	for {
		select {
		case <-c.done:
			return
		case <-tick.C:
		}
		if c.listen() == nil {
			klog.InfoS("The other kube-userspace-proxy in this network namespace is gone; this one now answers a process that looks for one, and repairs the portal rules it left")
			c.mu.Lock()
			f := c.onTakeOver
			c.mu.Unlock()
			if f != nil {
				f()
			}
			return
		}
	}
}

// OnTakeOver sets what to do once the other process is gone: its last
// sync left the portal rules naming its proxy ports, refused since it
// exited, until this one's next full sync repairs them (21-24 s of every
// Service refused, in the lifecycle sweep's overlapping restarts).
func (c *instanceClaim) OnTakeOver(f func()) {
	c.mu.Lock()
	c.onTakeOver = f
	c.mu.Unlock()
}

// holder reports whether a process listens on instanceSocket and its PID,
// by the kernel's credentials of the listener: 0 when it runs in another
// PID namespace (two pods of a DaemonSet without hostPID), which the
// network namespace, and so the clash, does not depend on.
func holder() (held bool, pid int) {
	c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: instanceSocket, Net: "unix"})
	if err != nil {
		return false, 0
	}
	defer c.Close()
	return true, peerPID(c)
}

// pidValue is a PID for a log line: "unknown" for 0 (another PID
// namespace's process).
func pidValue(pid int) any {
	if pid == 0 {
		return "unknown (another PID namespace)"
	}
	return pid
}

func peerPID(c *net.UnixConn) int {
	raw, err := c.SyscallConn()
	if err != nil {
		return 0
	}
	var cred *unix.Ucred
	_ = raw.Control(func(fd uintptr) { cred, err = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED) })
	if err != nil || cred == nil {
		return 0
	}
	return int(cred.Pid)
}

// announceOthers logs the processes that find this one holding
// instanceSocket (a second proxy starting, or --cleanup), until ln closes:
// each new PID, and one already logged again after a minute, ten at once
// and then one per 6 s at most (any process of the namespace may connect:
// a loop of them must not flood the log).
func announceOthers(ln *net.UnixListener, limit flowcontrol.RateLimiter) {
	lastPID, lastAt := 0, time.Time{}
	for {
		c, err := ln.AcceptUnix()
		if err != nil {
			return
		}
		if pid := peerPID(c); (pid != lastPID || time.Since(lastAt) > time.Minute) && limit.TryAccept() {
			lastPID, lastAt = pid, time.Now()
			klog.ErrorS(nil, "Another kube-userspace-proxy process in this network namespace found this one (a second proxy rewrites this one's rules, --cleanup removes them until the next sync)", "pid", pidValue(pid))
		}
		c.Close()
	}
}

// newInstanceLogLimiter bounds announceOthers' lines (a variable: tests
// stop its clock).
var newInstanceLogLimiter = func() flowcontrol.RateLimiter { return flowcontrol.NewTokenBucketRateLimiter(1.0/6, 10) }

func (c *instanceClaim) release() {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.released {
		return
	}
	c.released = true
	close(c.done)
	if c.ln != nil {
		_ = c.ln.Close()
	}
}
