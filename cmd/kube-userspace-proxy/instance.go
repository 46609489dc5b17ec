package main

import (
	"errors"
	"net"
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

// instanceClaim is this process's hold on instanceSocket (nil: another
// process holds it, or the socket could not be made).
type instanceClaim struct{ ln *net.UnixListener }

// claimInstance takes instanceSocket, or reports the PID of the process
// that holds it (0 when it holds none, or cannot tell). The holder logs
// each process that finds it.
func claimInstance() (*instanceClaim, int) {
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: instanceSocket, Net: "unix"})
	if err == nil {
		go announceOthers(ln, newInstanceLogLimiter())
		return &instanceClaim{ln: ln}, 0
	}
	if !errors.Is(err, syscall.EADDRINUSE) {
		klog.V(2).InfoS("Cannot watch for a second proxy on this node", "err", err)
		return nil, 0
	}
	return nil, holderPID()
}

// holderPID is the PID of the process listening on instanceSocket, by the
// kernel's credentials of the listener.
func holderPID() int {
	c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: instanceSocket, Net: "unix"})
	if err != nil {
		return 0
	}
	defer c.Close()
	return peerPID(c)
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
		if pid := peerPID(c); pid > 0 && (pid != lastPID || time.Since(lastAt) > time.Minute) && limit.TryAccept() {
			lastPID, lastAt = pid, time.Now()
			klog.ErrorS(nil, "Another kube-userspace-proxy process in this network namespace found this one (a second proxy rewrites this one's rules, --cleanup removes them until the next sync)", "pid", pid)
		}
		c.Close()
	}
}

// newInstanceLogLimiter bounds announceOthers' lines (a variable: tests
// stop its clock).
var newInstanceLogLimiter = func() flowcontrol.RateLimiter { return flowcontrol.NewTokenBucketRateLimiter(1.0/6, 10) }

func (c *instanceClaim) release() {
	if c != nil {
		_ = c.ln.Close()
	}
}
