package main

import (
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	"k8s.io/client-go/util/flowcontrol"
	"k8s.io/klog/v2"
)

// instanceSocket is the abstract unix socket a proxy that programs rules
// listens on for its life, so that a second one on the same node finds it
// and waits for its exit before it writes a rule: the two would rewrite
// each other's chains (neither knows the other's ports). An abstract name belongs to the network namespace, as
// the rules do: proxies in other namespaces (tests, the demo) never meet
// it; and it goes with the process, so a crash leaves nothing stale.
var instanceSocket = "@kube-userspace-proxy.rules"

// instanceClaim is this process's hold on instanceSocket, or its wait for
// it: a process that found another holding it takes the name once that
// one is gone, so that a third still finds a proxy (a rolling restart
// overlaps the old and the new one; the new one stays). Meanwhile it
// stays connected to the holder and says it is a proxy that waits
// (instanceHello, instanceWaiting), so that the holder learns of its exit
// too. The waiter repairs the rules at once when the holder goes; the
// holder, when an older proxy that wrote rules beside it goes (one that
// only waited wrote none).
type instanceClaim struct {
	// instanceSocket, instanceRetryEvery and newInstanceLogLimiter as
	// they were at the claim (its wait runs on).
	name       string
	retryEvery time.Duration
	newLimiter func() flowcontrol.RateLimiter

	mu       sync.Mutex
	ln       *net.UnixListener // nil while another process holds the name
	released bool
	// onOtherGone is called once the other process is gone (OnOtherGone).
	onOtherGone func()
	done        chan struct{} // closed by release: the wait ends
	// toHolder is the connection to the holder while this process waits
	// (nil once it ended); holderGone is told when it ends.
	toHolder   *net.UnixConn
	holderGone chan struct{}
	// otherUser: the last look found the name held by a process of
	// another user (logged once), which is no proxy: its going asks for
	// no repair.
	otherUser, otherUserLogged bool
	// noProxyHolds is closed once no other proxy holds the name: this
	// process took it, or the holder is no proxy (another user's, or
	// none that answers). Until then this process writes no rule and
	// opens no proxy socket (NoProxyHolds).
	noProxyHolds  chan struct{}
	noProxyClosed bool
	// peers are the proxies that found this one and said so, while they
	// run (at most maxInstancePeers).
	peers map[*net.UnixConn]bool
	// proxies counts the peers that said they are proxies (instanceHello)
	// and still run.
	proxies int
}

// instanceHello is what a proxy that programs rules writes to the holder
// of instanceSocket, whose connection it then keeps for its life: the
// holder repairs the rules when that connection ends. A process that only
// looks or an older proxy writes nothing and is not waited on; --cleanup
// writes instanceCleanup.
const instanceHello = "kube-userspace-proxy rules\n"

// instanceWaiting follows instanceHello from a proxy that waits for the
// holder, writing no rule while its connection lasts: its exit leaves the
// holder nothing to repair. A proxy that says instanceHello alone (one
// older than this) may have written rules naming its ports. An older
// holder reads instanceHello's length and discards what follows.
const instanceWaiting = "waiting\n"

// instanceCleanup is what --cleanup writes to the holder (as long as
// instanceHello: the holder reads that many bytes), keeping its connection
// while it removes the rules: the holder puts them back when it ends
// (holderDuringCleanup).
const instanceCleanup = "kube-userspace-proxy clean\n"

// instanceHelloWithin is how long the holder waits for instanceHello;
// maxInstancePeers bounds the connections it keeps (any process of the
// namespace may connect).
const (
	instanceHelloWithin = 2 * time.Second
	maxInstancePeers    = 16
)

// nameFoundTaken, when set (tests), runs between the claim's listen that
// found the name taken and its dial to the holder.
var nameFoundTaken func()

// instanceRetryEvery is how often a process waiting for instanceSocket
// tries to take it (a variable: tests shorten it).
var instanceRetryEvery = 5 * time.Second

// claimInstance takes instanceSocket, or reports that another process
// holds it (held) and, when this process can see it, that one's PID, and
// then waits for it to be free. The holder logs each process that finds
// it. release ends the hold or the wait.
func claimInstance() (claim *instanceClaim, held bool, pid int) {
	c := &instanceClaim{name: instanceSocket, retryEvery: instanceRetryEvery, newLimiter: newInstanceLogLimiter,
		done: make(chan struct{}), holderGone: make(chan struct{}, 1), peers: map[*net.UnixConn]bool{},
		noProxyHolds: make(chan struct{})}
	err := c.listen()
	if err == nil {
		return c, false, 0
	}
	if !errors.Is(err, syscall.EADDRINUSE) {
		klog.V(2).InfoS("Cannot watch for a second proxy on this node", "err", err)
		c.mu.Lock()
		c.noProxyHoldsLocked()
		c.mu.Unlock()
		return c, false, 0
	}
	if nameFoundTaken != nil {
		nameFoundTaken()
	}
	held, pid, took := c.connectOrTake()
	if !took {
		go c.takeOverWhenFree()
	}
	return c, held, pid
}

// connectOrTake connects to the holder (connect). A refused dial finds no
// listener: the holder exited since the name was found taken, so the name
// is taken at once (took), and only then does this process stop waiting: a
// proxy starting meanwhile may take it first. Said free at the refusal, the
// two ran and rewrote each other's rules for good, as this one never waited
// again. Refused again once the name is found taken again, it is held by a
// socket that does not listen (any local user can bind an abstract name):
// no proxy.
func (c *instanceClaim) connectOrTake() (held bool, pid int, took bool) {
	for range 2 {
		held, pid, refused := c.connect()
		if !refused {
			return held, pid, false
		}
		if c.listen() == nil {
			return false, 0, true
		}
	}
	c.mu.Lock()
	c.noProxyHoldsLocked()
	c.mu.Unlock()
	return false, 0, false
}

// connect connects to the holder and says this is a proxy (instanceHello),
// keeping the connection until release or the holder's exit, which tells
// holderGone. It reports whether a process holds the name, and its PID;
// refused: no socket listens on the name (connectOrTake).
func (c *instanceClaim) connect() (held bool, pid int, refused bool) {
	conn, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: c.name, Net: "unix"})
	if errors.Is(err, syscall.ECONNREFUSED) {
		return false, 0, true
	}
	if err != nil {
		// A name this process cannot connect to: no proxy answers on it.
		c.mu.Lock()
		c.noProxyHoldsLocked()
		c.mu.Unlock()
		return false, 0, false
	}
	pid, uid, trusted := peerCred(conn)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.otherUser = !trusted
	if !trusted {
		// Any local user can take an abstract name: waiting for such a
		// process would let it keep the proxy from serving.
		c.noProxyHoldsLocked()
		conn.Close()
		if !c.otherUserLogged {
			c.otherUserLogged = true
			logOtherUserHolder(pid, uid)
		}
		return false, 0, false
	}
	if c.released {
		conn.Close()
		return true, pid, false
	}
	if _, err := conn.Write([]byte(instanceHello + instanceWaiting)); err != nil {
		conn.Close()
		return true, pid, false
	}
	c.toHolder = conn
	go func() {
		// The holder writes nothing: the read ends when it exits (or
		// closes the connection: an older proxy does at once).
		_, _ = io.Copy(io.Discard, conn)
		c.mu.Lock()
		if c.toHolder == conn {
			c.toHolder = nil
		}
		c.mu.Unlock()
		conn.Close()
		select {
		case c.holderGone <- struct{}{}:
		default:
		}
	}()
	return true, pid, false
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
	c.noProxyHoldsLocked()
	if c.toHolder != nil {
		c.toHolder.Close()
		c.toHolder = nil
	}
	go c.announceOthers(ln, c.newLimiter())
	return nil
}

func (c *instanceClaim) takeOverWhenFree() {
	tick := time.NewTicker(c.retryEvery)
	defer tick.Stop()
	for {
		reconnect := false
		select {
		case <-c.done:
			return
		case <-c.holderGone: // its exit, most likely: try at once
		case <-tick.C:
			reconnect = true
		}
		took := c.listen() == nil
		if !took {
			c.mu.Lock()
			lost := c.toHolder == nil
			c.mu.Unlock()
			if reconnect && lost {
				// Another process took the name first (a third proxy),
				// or an older holder closed the connection: at most once
				// per tick, so that one closing at once costs no busy
				// loop.
				_, _, took = c.connectOrTake()
			}
		}
		if took {
			c.mu.Lock()
			otherUser := c.otherUser
			c.mu.Unlock()
			if otherUser {
				klog.InfoS("The process of another user that held the instance socket's name is gone; this proxy now holds it", "name", c.name)
				return
			}
			klog.InfoS("The other kube-userspace-proxy in this network namespace is gone; this one now answers a process that looks for one, and repairs the portal rules it left")
			c.otherGone()
			return
		}
	}
}

// NoProxyHolds is closed once no other kube-userspace-proxy holds the
// name: at once when none did at the claim, else when the holder exits
// (this process takes the name) or is found to be no proxy. A proxy that
// found another waits for it before it writes a rule or opens a proxy
// socket: the two rewrote each other's portals with their own ports, and
// one with other Services (a second DaemonSet, an operator's test run)
// removed the first's, refused by turns between their full syncs. Once the
// holder is gone, this one's first sync is a restart over its rules.
func (c *instanceClaim) NoProxyHolds() <-chan struct{} { return c.noProxyHolds }

func (c *instanceClaim) noProxyHoldsLocked() {
	if !c.noProxyClosed {
		c.noProxyClosed = true
		close(c.noProxyHolds)
	}
}

// OnOtherGone sets what to do once the other process is gone: this one
// took the name over, or the one that found this one exited. Its last
// sync left the portal rules naming its proxy ports, refused since it
// exited, until this one's next full sync repairs them (21-24 s of every
// Service refused, in the lifecycle sweep's overlapping restarts; 23 s in
// the upgrade sweep when the second one went first).
func (c *instanceClaim) OnOtherGone(f func()) {
	c.mu.Lock()
	c.onOtherGone = f
	c.mu.Unlock()
}

func (c *instanceClaim) otherGone() {
	c.mu.Lock()
	f := c.onOtherGone
	c.mu.Unlock()
	if f != nil {
		f()
	}
}

// holder reports whether a kube-userspace-proxy (a process of root or of
// this process's user) listens on instanceSocket and its PID, by the
// kernel's credentials of the listener: 0 when it runs in another PID
// namespace (two pods of a DaemonSet without hostPID), which the network
// namespace, and so the clash, does not depend on. A process of another
// user holding the name is logged and is no proxy.
func holder() (held bool, pid int) {
	c, pid := dialHolder()
	if c == nil {
		return false, 0
	}
	c.Close()
	return true, pid
}

// holderDuringCleanup is holder for --cleanup: it tells the holder that a
// cleanup runs (instanceCleanup) and keeps the connection until done, which
// the cleanup calls once it removed the rules, so that the holder puts them
// back at once. It did at its next full sync: every Service was refused
// until then (377 of 3,853 connections at 100/s in one try, 4.8 s; up to
// the whole --iptables-sync-period).
func holderDuringCleanup() (held bool, pid int, done func()) {
	c, pid := dialHolder()
	if c == nil {
		return false, 0, func() {}
	}
	if _, err := c.Write([]byte(instanceCleanup)); err != nil {
		c.Close()
		return true, pid, func() {}
	}
	return true, pid, func() { c.Close() }
}

// dialHolder connects to a kube-userspace-proxy holding instanceSocket:
// nil when none, or when the holder is another user's process (logged).
func dialHolder() (*net.UnixConn, int) {
	c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: instanceSocket, Net: "unix"})
	if err != nil {
		return nil, 0
	}
	pid, uid, trusted := peerCred(c)
	if !trusted {
		c.Close()
		logOtherUserHolder(pid, uid)
		return nil, 0
	}
	return c, pid
}

// logOtherUserHolder says that the name is held by a process that is no
// proxy: any local user can take an abstract name before the proxy starts.
func logOtherUserHolder(pid int, uid uint32) {
	klog.InfoS("Warning: the instance socket's name is held by a process of another user, not a kube-userspace-proxy: ignored, so a second proxy on this node goes unnoticed while it holds it",
		"name", instanceSocket, "uid", uid, "pid", pidValue(pid))
}

// pidValue is a PID for a log line: "unknown" for 0 (another PID
// namespace's process).
func pidValue(pid int) any {
	if pid == 0 {
		return "unknown (another PID namespace)"
	}
	return pid
}

// peerCred reads the kernel's credentials of c's other end (SO_PEERCRED)
// and whether it may be a kube-userspace-proxy of this node: a process of
// root or of this process's user. Any user of the network namespace can
// connect to an abstract socket, or take its name, so one of another user
// is not heard (it forced full repair syncs at will, and could fill the
// peer places); credentials that cannot be read are not trusted.
func peerCred(c *net.UnixConn) (pid int, uid uint32, trusted bool) {
	raw, err := c.SyscallConn()
	if err != nil {
		return 0, 0, false
	}
	var cred *unix.Ucred
	if cerr := raw.Control(func(fd uintptr) { cred, err = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED) }); cerr != nil || err != nil || cred == nil {
		return 0, 0, false
	}
	return int(cred.Pid), cred.Uid, cred.Uid == 0 || cred.Uid == uint32(os.Geteuid())
}

// announceOthers logs the processes that find this one holding
// instanceSocket (a second proxy starting, or --cleanup), until ln closes:
// each new PID, and one already logged again after a minute, ten at once
// and then one per 6 s at most (any process of the namespace may connect:
// a loop of them must not flood the log). A proxy among them is watched
// until it exits (watchPeer).
func (c *instanceClaim) announceOthers(ln *net.UnixListener, limit flowcontrol.RateLimiter) {
	lastPID, lastAt := 0, time.Time{}
	otherUsers, otherUsersLimit := 0, c.newLimiter()
	for {
		conn, err := ln.AcceptUnix()
		if err != nil {
			return
		}
		pid, uid, trusted := peerCred(conn)
		if !trusted {
			// Closed at once, holding no peer place: its hello and close
			// asked for a full repair sync, as often as it liked.
			conn.Close()
			otherUsers++
			if otherUsersLimit.TryAccept() {
				klog.InfoS("Warning: ignored a process of another user on the instance socket (only root's and this proxy's user's are heard)",
					"uid", uid, "pid", pidValue(pid), "ignoredSoFar", otherUsers)
			}
			continue
		}
		if (pid != lastPID || time.Since(lastAt) > time.Minute) && limit.TryAccept() {
			lastPID, lastAt = pid, time.Now()
			klog.ErrorS(nil, "Another kube-userspace-proxy process in this network namespace found this one (a second proxy waits for this one to exit; --cleanup removes its rules until the next sync)", "pid", pidValue(pid))
		}
		c.mu.Lock()
		keep := !c.released && len(c.peers) < maxInstancePeers
		if keep {
			c.peers[conn] = true
		}
		c.mu.Unlock()
		if !keep {
			conn.Close()
			continue
		}
		go c.watchPeer(conn, pid, limit)
	}
}

// watchPeer waits for a process that found this one to say it is a proxy
// (instanceHello) and then for its exit, which the end of its connection
// tells. One that waited for this one (instanceWaiting) wrote no rule, so
// its going leaves nothing to repair (the holder ran a full repair sync
// for each); an older proxy's last sync may have left the rules naming
// its ports, so this one repairs them at once. Anything else is closed.
func (c *instanceClaim) watchPeer(conn *net.UnixConn, pid int, limit flowcontrol.RateLimiter) {
	defer func() {
		c.mu.Lock()
		delete(c.peers, conn)
		c.mu.Unlock()
		conn.Close()
	}()
	hello := make([]byte, len(instanceHello))
	_ = conn.SetReadDeadline(time.Now().Add(instanceHelloWithin))
	if _, err := io.ReadFull(conn, hello); err != nil {
		return
	}
	_ = conn.SetReadDeadline(time.Time{})
	if string(hello) == instanceCleanup {
		// A --cleanup removing every rule of ours: put back once it ends.
		_, _ = io.Copy(io.Discard, conn)
		c.mu.Lock()
		released := c.released
		c.mu.Unlock()
		if !released && limit.TryAccept() {
			klog.InfoS("The --cleanup that found this one ended; putting the rules back", "pid", pidValue(pid))
		}
		if !released {
			c.otherGone()
		}
		return
	}
	if string(hello) != instanceHello {
		return
	}
	c.mu.Lock()
	c.proxies++
	c.mu.Unlock()
	// Sent with the hello; an older proxy sends nothing more, so the read
	// ends with its connection.
	waiting := make([]byte, len(instanceWaiting))
	_, err := io.ReadFull(conn, waiting)
	waited := err == nil && string(waiting) == instanceWaiting
	_, _ = io.Copy(io.Discard, conn)
	c.mu.Lock()
	c.proxies--
	released := c.released
	c.mu.Unlock()
	if released {
		return // this one is stopping: its own close ended the connection
	}
	if waited {
		if limit.TryAccept() {
			klog.InfoS("The other kube-userspace-proxy in this network namespace, which waited for this one, exited; it wrote no rule", "pid", pidValue(pid))
		}
		return
	}
	if limit.TryAccept() {
		klog.InfoS("The other kube-userspace-proxy in this network namespace exited; repairing the portal rules it left naming its ports", "pid", pidValue(pid))
	}
	c.otherGone()
}

// othersRunning reports whether another proxy programs this network
// namespace's rules: one that found this one and said so, or the holder
// this one waits for.
func (c *instanceClaim) othersRunning() bool {
	if c == nil {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.proxies > 0 || c.toHolder != nil
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
	// After the listener: a waiting proxy told of this one's exit finds
	// the name free.
	for conn := range c.peers {
		conn.Close()
	}
	if c.toHolder != nil {
		c.toHolder.Close()
		c.toHolder = nil
	}
}
