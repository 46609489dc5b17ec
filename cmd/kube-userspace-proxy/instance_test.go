package main

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"k8s.io/client-go/util/flowcontrol"
	testingclock "k8s.io/utils/clock/testing"
)

// A second claim in the namespace learns the holder's PID, and the holder
// logs the process that found it; once released, the name is free again.
func TestSecondInstanceFindsTheFirst(t *testing.T) {
	useOwnInstanceName(t)
	logs := captureKlog(t)

	if held, pid := holder(); held || pid != 0 {
		t.Fatalf("holder with none = %v, %d; want false, 0", held, pid)
	}
	first, held, other := claimInstance()
	if !first.holding() || held || other != 0 {
		t.Fatalf("first claim holds %v, held %v, other %d; want a claim", first.holding(), held, other)
	}
	second, held, other := claimInstance()
	if second.holding() || !held || other != os.Getpid() {
		t.Fatalf("second claim holds %v, held %v, other %d; want false, true, %d", second.holding(), held, other, os.Getpid())
	}
	second.release() // no longer waiting to take the name over
	want := fmt.Sprintf("pid=%d", os.Getpid())
	for deadline := time.Now().Add(5 * time.Second); !strings.Contains(logs.String(), want); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the holder did not log the process that found it:\n%s", logs.String())
		}
	}
	// The same process again within the minute: not logged again (klog
	// writes a line once per severity it reaches: count, then compare).
	time.Sleep(100 * time.Millisecond)
	logged := strings.Count(logs.String(), want)
	again, _, other := claimInstance()
	if other != os.Getpid() {
		t.Fatalf("third claim's other = %d", other)
	}
	time.Sleep(100 * time.Millisecond)
	if n := strings.Count(logs.String(), want); n != logged {
		t.Fatalf("the holder logged the same process again within a minute:\n%s", logs.String())
	}
	// Released before the first: a claim still waiting takes the name as
	// soon as its holder goes.
	again.release()
	first.release()
	third, held, _ := claimInstance()
	if !third.holding() || held {
		t.Fatalf("claim after release holds %v, held %v; want a claim", third.holding(), held)
	}
	third.release()
	third.release() // twice: nothing more to do
	var none *instanceClaim
	none.release() // a proxy without rules claims nothing
}

// A process that found another holding the name takes it once that one
// is gone, so that a third still finds a proxy: a rolling restart
// overlaps the old and the new one, and the new one stays. Without the
// takeover, the third found none (the test failed at "a third claim").
func TestSecondInstanceTakesOverTheName(t *testing.T) {
	saved, savedEvery := instanceSocket, instanceRetryEvery
	instanceSocket = fmt.Sprintf("@kube-userspace-proxy.test.%d.%d", os.Getpid(), time.Now().UnixNano())
	instanceRetryEvery = 10 * time.Millisecond
	defer func() { instanceSocket, instanceRetryEvery = saved, savedEvery }()
	captureKlog(t)

	old, _, _ := claimInstance()
	replacement, held, _ := claimInstance()
	defer replacement.release()
	if !held || replacement.holding() {
		t.Fatalf("second claim: held %v, holding %v; want true, false", held, replacement.holding())
	}
	// The first one's claim saw no other proxy; the second waits (its
	// run writes no rule until then).
	select {
	case <-old.NoProxyHolds():
	default:
		t.Fatal("the first claim waits for another proxy")
	}
	select {
	case <-replacement.NoProxyHolds():
		t.Fatal("the second claim does not wait for the first")
	default:
	}
	// It repairs the rules the other left naming its ports at once (the
	// run wires this to Proxier.RepairSoon), not at its next full sync.
	tookOver := make(chan struct{}, 1)
	replacement.OnOtherGone(func() { tookOver <- struct{}{} })
	old.release()
	for deadline := time.Now().Add(5 * time.Second); !replacement.holding(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the second process did not take the name over after the first released it")
		}
	}
	select {
	case <-tookOver:
	case <-time.After(5 * time.Second):
		t.Fatal("the takeover did not call OnOtherGone's function")
	}
	select {
	case <-replacement.NoProxyHolds():
	default:
		t.Fatal("the second claim still waits after it took the name")
	}
	third, held, pid := claimInstance()
	defer third.release()
	if !held || pid != os.Getpid() {
		t.Fatalf("a third claim: held %v, pid %d; want the second process found", held, pid)
	}
	// A released wait takes nothing over.
	third.release()
	replacement.release()
	time.Sleep(50 * time.Millisecond)
	if held, _ := holder(); held {
		t.Fatal("a released claim took the name over")
	}
}

// The proxy that held the name repairs the rules at once when an older
// proxy that found it exits (a rolled-back surge pod, or "stop one"; one
// that says instanceHello alone, and did not wait): that one's last sync
// left them naming its ports, and every Service was refused until this
// one's next full sync (23 s in the upgrade sweep). A process that only
// looks (--cleanup) and goes asks for no repair. Before, the holder closed
// the other's connection at once and never learned of its exit (the test
// failed at "did not repair").
func TestFirstInstanceRepairsWhenTheSecondExits(t *testing.T) {
	useOwnInstanceName(t)
	logs := captureKlog(t)

	_, repaired := holderCountingRepairs(t)
	if held, _ := holder(); !held { // --cleanup's look
		t.Fatal("holder() found no holder")
	}
	second := dialOlderProxy(t)
	time.Sleep(200 * time.Millisecond)
	select {
	case <-repaired:
		t.Fatal("the holder repaired while the other still runs, or after a process that only looked")
	default:
	}
	second.Close() // the second process exits
	select {
	case <-repaired:
	case <-time.After(5 * time.Second):
		t.Fatalf("the holder did not repair once the other exited:\n%s", logs.String())
	}
	if !strings.Contains(logs.String(), "exited") {
		t.Errorf("the holder did not log the other's exit:\n%s", logs.String())
	}
}

// A proxy that only waited for the holder (it wrote no rule and opened no
// proxy socket) and exits leaves nothing to repair: the holder runs no
// repair sync. It logged "The other kube-userspace-proxy in this network
// namespace exited; repairing the portal rules it left naming its ports"
// and ran a full sync for nothing (the test failed at "repaired"). An
// older proxy, which says instanceHello alone and may have written rules
// beside the holder's, is still repaired after
// (TestFirstInstanceRepairsWhenTheSecondExits).
func TestHolderRepairsNothingWhenAWaiterExits(t *testing.T) {
	useOwnInstanceName(t)
	logs := captureKlog(t)

	first, _, _ := claimInstance()
	defer first.release()
	repaired := make(chan struct{}, 4)
	first.OnOtherGone(func() { repaired <- struct{}{} })
	waiter, held, _ := claimInstance()
	if !held || waiter.holding() {
		t.Fatalf("second claim: held %v, holding %v; want a waiter", held, waiter.holding())
	}
	waitFor(t, "the holder to know the waiter runs", first.othersRunning)
	waiter.release()
	waitFor(t, "the holder to be done with the waiter", func() bool {
		first.mu.Lock()
		defer first.mu.Unlock()
		return len(first.peers) == 0
	})
	select {
	case <-repaired:
		t.Fatalf("the holder repaired the rules when a proxy that only waited exited:\n%s", logs.String())
	default:
	}
	if strings.Contains(logs.String(), "repairing") {
		t.Errorf("the holder says it repairs after a waiter:\n%s", logs.String())
	}
}

// dialOlderProxy is a proxy older than instanceWaiting finding the holder:
// it says instanceHello alone (and wrote rules beside the holder's).
func dialOlderProxy(t *testing.T) *net.UnixConn {
	t.Helper()
	c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: instanceSocket, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Write([]byte(instanceHello)); err != nil {
		c.Close()
		t.Fatal(err)
	}
	return c
}

// With three proxies, the one still waiting when another took the name
// over connects to the new holder, which then learns of its exit too (and
// repairs nothing: it only waited).
func TestWaitingInstanceFollowsTheNewHolder(t *testing.T) {
	saved, savedEvery := instanceSocket, instanceRetryEvery
	instanceSocket = fmt.Sprintf("@kube-userspace-proxy.test.%d.%d", os.Getpid(), time.Now().UnixNano())
	instanceRetryEvery = 10 * time.Millisecond
	defer func() { instanceSocket, instanceRetryEvery = saved, savedEvery }()
	captureKlog(t)

	first, _, _ := claimInstance()
	second, _, _ := claimInstance()
	third, _, _ := claimInstance()
	defer second.release()
	defer third.release()
	repaired := map[*instanceClaim]chan struct{}{second: make(chan struct{}, 4), third: make(chan struct{}, 4)}
	for c, ch := range repaired {
		c.OnOtherGone(func() { ch <- struct{}{} })
	}
	first.release()
	var holder, waiter *instanceClaim
	for deadline := time.Now().Add(5 * time.Second); holder == nil; time.Sleep(5 * time.Millisecond) {
		switch {
		case second.holding():
			holder, waiter = second, third
		case third.holding():
			holder, waiter = third, second
		case time.Now().After(deadline):
			t.Fatal("neither waiting claim took the name over")
		}
	}
	<-repaired[holder] // its takeover's repair
	waitFor(t, "the waiter to connect to the new holder", holder.othersRunning)
	waiter.release()
	waitFor(t, "the new holder to learn the waiter exited", func() bool { return !holder.othersRunning() })
	select {
	case <-repaired[holder]:
		t.Fatal("the new holder repaired when the proxy still waiting exited, which wrote no rule")
	default:
	}
}

// TestInstanceConnectHelper is a process of its own for
// TestInstanceLogIsBounded and TestInstanceAcrossPIDNamespaces: it finds
// the holder of the socket it is given (with KUP_TEST_WANT_PID, of that
// PID as this process sees it).
func TestInstanceConnectHelper(t *testing.T) {
	name := os.Getenv("KUP_TEST_INSTANCE_SOCKET")
	if name == "" {
		t.Skip("a helper process of TestInstanceLogIsBounded")
	}
	instanceSocket = name
	held, pid := holder()
	if !held {
		t.Fatal("no holder found")
	}
	if want := os.Getenv("KUP_TEST_WANT_PID"); want != "" && fmt.Sprint(pid) != want {
		t.Fatalf("holder's PID %d, want %s", pid, want)
	}
}

// A proxy whose PID namespace cannot see the holder (two DaemonSet pods
// without hostPID) still finds it: held, PID 0 ("unknown" in the log).
// Before, a PID of 0 read as no holder, and the clash went unsaid.
func TestInstanceAcrossPIDNamespaces(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("unshare --pid needs root")
	}
	useOwnInstanceName(t)
	captureKlog(t)
	claim, _, _ := claimInstance()
	if claim == nil {
		t.Fatal("no claim")
	}
	defer claim.release()
	cmd := exec.Command("unshare", "--pid", "--fork", os.Args[0], "-test.run=^TestInstanceConnectHelper$")
	cmd.Env = append(os.Environ(), "KUP_TEST_INSTANCE_SOCKET="+instanceSocket, "KUP_TEST_WANT_PID=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		if strings.Contains(string(out), "unshare failed") {
			t.Skipf("no PID namespaces here: %s", out)
		}
		t.Fatalf("the helper in its own PID namespace: %v\n%s", err, out)
	}
	if got := pidValue(0); got != "unknown (another PID namespace)" {
		t.Fatalf("pidValue(0) = %v", got)
	}
}

// Any process of the namespace may connect to the instance socket: fifteen
// of them get ten lines logged, not fifteen.
func TestInstanceLogIsBounded(t *testing.T) {
	useOwnInstanceName(t)
	savedLimiter := newInstanceLogLimiter
	defer func() { newInstanceLogLimiter = savedLimiter }()
	// Time stands still: no token comes back while the helpers start.
	newInstanceLogLimiter = func() flowcontrol.RateLimiter {
		return flowcontrol.NewTokenBucketRateLimiterWithClock(1.0/6, 10, testingclock.NewFakeClock(time.Now()))
	}
	logs := captureKlog(t)
	claim, _, _ := claimInstance()
	if claim == nil {
		t.Fatal("no claim")
	}
	defer claim.release()
	pids := map[int]bool{}
	for range 15 {
		cmd := exec.Command(os.Args[0], "-test.run=^TestInstanceConnectHelper$")
		cmd.Env = append(os.Environ(), "KUP_TEST_INSTANCE_SOCKET="+instanceSocket)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("helper: %v\n%s", err, out)
		}
		pids[cmd.Process.Pid] = true
	}
	time.Sleep(200 * time.Millisecond)
	logged := 0
	for pid := range pids {
		if strings.Contains(logs.String(), fmt.Sprintf("pid=%d\n", pid)) {
			logged++
		}
	}
	if logged != 10 {
		t.Fatalf("%d of 15 processes that found the holder were logged, want 10 (the burst)", logged)
	}
}

// The package's tests never meet a proxy running on this host: whatever
// reaches claimInstance or holder (--cleanup's path in runMain) uses a name
// of this test process's own.
func init() {
	instanceSocket = fmt.Sprintf("@kube-userspace-proxy.test.%d", os.Getpid())
}

// useOwnInstanceName gives the test an instanceSocket name no other test
// (nor a claim left by one) meets, for its duration.
func useOwnInstanceName(t *testing.T) {
	saved := instanceSocket
	instanceSocket = fmt.Sprintf("@kube-userspace-proxy.test.%d.%d", os.Getpid(), time.Now().UnixNano())
	t.Cleanup(func() { instanceSocket = saved })
}

// holderCountingRepairs claims the instance name, first, and returns the
// claim, released when t ends, and a channel that gets a value each time
// the claim is asked to repair the rules (OnOtherGone).
func holderCountingRepairs(t *testing.T) (*instanceClaim, chan struct{}) {
	first, _, _ := claimInstance()
	t.Cleanup(first.release)
	repaired := make(chan struct{}, 64)
	first.OnOtherGone(func() { repaired <- struct{}{} })
	return first, repaired
}

// holding reports whether the claim holds instanceSocket now.
func (c *instanceClaim) holding() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ln != nil
}

// Each of two proxies knows the other runs (othersRunning: a stopping one
// then leaves the accepts of portal traffic to it) while both do, and the
// one that stays knows it no longer does once the other exits; a process
// that only looks (--cleanup) is no proxy.
func TestInstancesKnowTheOtherRuns(t *testing.T) {
	useOwnInstanceName(t)

	first, _, _ := claimInstance()
	defer first.release()
	if first.othersRunning() {
		t.Fatal("a lone proxy finds another running")
	}
	if held, _ := holder(); !held { // --cleanup's look
		t.Fatal("holder() found no holder")
	}
	time.Sleep(100 * time.Millisecond)
	if first.othersRunning() {
		t.Fatal("a process that only looked counts as a proxy")
	}
	second, _, _ := claimInstance()
	if !second.othersRunning() {
		t.Error("the second proxy does not know the first runs")
	}
	waitFor(t, "the first to know the second runs", first.othersRunning)
	second.release()
	waitFor(t, "the first to know the second exited", func() bool { return !first.othersRunning() })
	if second.othersRunning() {
		t.Error("a released claim still finds another running")
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// TestInstanceOtherUserHelper is a process of its own for the tests of
// processes of another user: it drops to nobody and, with
// KUP_TEST_INSTANCE_MODE "hello", holds 20 connections to the socket
// each saying instanceHello, or with "squat" holds the name itself; it
// says "ready" and keeps them until its stdin closes.
func TestInstanceOtherUserHelper(t *testing.T) {
	name, mode := os.Getenv("KUP_TEST_INSTANCE_SOCKET"), os.Getenv("KUP_TEST_INSTANCE_MODE")
	if name == "" || mode == "" {
		t.Skip("a helper process of the other-user instance tests")
	}
	if err := syscall.Setgid(65534); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Setuid(65534); err != nil {
		t.Fatal(err)
	}
	addr := &net.UnixAddr{Name: name, Net: "unix"}
	switch mode {
	case "hello":
		for range 20 {
			c, err := net.DialUnix("unix", nil, addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			// A holder that hears no other user has closed it already.
			_, _ = c.Write([]byte(instanceHello))
		}
	case "squat":
		ln, err := net.ListenUnix("unix", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
	}
	fmt.Println("ready")
	_, _ = io.Copy(io.Discard, os.Stdin)
}

// startOtherUser runs TestInstanceOtherUserHelper in mode on the test's
// socket; stop ends it (its connections or listener go with it).
func startOtherUser(t *testing.T, mode string) (stop func()) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("a process of another user needs root")
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestInstanceOtherUserHelper$")
	cmd.Env = append(os.Environ(), "KUP_TEST_INSTANCE_SOCKET="+instanceSocket, "KUP_TEST_INSTANCE_MODE="+mode)
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	out := bufio.NewReader(stdout)
	line, err := out.ReadString('\n')
	if err != nil || line != "ready\n" {
		rest, _ := io.ReadAll(out)
		stdin.Close()
		_ = cmd.Wait()
		t.Fatalf("helper as nobody: %v\n%s%s", err, line, rest)
	}
	var once sync.Once
	stop = func() { once.Do(func() { stdin.Close(); _ = cmd.Wait() }) }
	t.Cleanup(stop)
	return stop
}

// A process of another user (any local user can connect to an abstract
// socket) is not heard: its hellos and their ends ask for no repair, and
// its connections take none of the maxInstancePeers places, so a real
// second proxy is still watched. Before, each hello then close forced a
// full repair sync, and 16 held connections made the holder drop the real
// one's, which got no repair at its exit.
func TestInstanceIgnoresOtherUsers(t *testing.T) {
	useOwnInstanceName(t)
	logs := captureKlog(t)

	_, repaired := holderCountingRepairs(t)
	stop := startOtherUser(t, "hello")
	time.Sleep(100 * time.Millisecond)
	second := dialOlderProxy(t) // one that may have written rules: repaired at its exit
	time.Sleep(100 * time.Millisecond)
	second.Close()
	select {
	case <-repaired:
	case <-time.After(5 * time.Second):
		t.Fatalf("the holder did not repair at the real second proxy's exit while another user held 20 connections:\n%s", logs)
	}
	stop() // its 20 hellos end
	time.Sleep(300 * time.Millisecond)
	if n := len(repaired); n != 0 {
		t.Fatalf("%d repairs asked for by another user's connections ending, want none:\n%s", n, logs)
	}
	if !strings.Contains(logs.String(), "uid=65534") {
		t.Errorf("the ignored connections were not logged:\n%s", logs)
	}
}

// A process of another user holding the name is no kube-userspace-proxy:
// a starting proxy and --cleanup say so rather than "Another
// kube-userspace-proxy is running" with its PID, and the proxy takes the
// name once it is free. Before, the squatter was reported as a proxy.
func TestInstanceNameHeldByOtherUser(t *testing.T) {
	saved, savedEvery := instanceSocket, instanceRetryEvery
	instanceSocket = fmt.Sprintf("@kube-userspace-proxy.test.%d.%d", os.Getpid(), time.Now().UnixNano())
	instanceRetryEvery = 10 * time.Millisecond
	defer func() { instanceSocket, instanceRetryEvery = saved, savedEvery }()
	logs := captureKlog(t)

	stop := startOtherUser(t, "squat")
	if held, pid := holder(); held {
		t.Errorf("--cleanup's look: held by pid %d, want no proxy found", pid)
	}
	claim, held, pid := claimInstance()
	defer claim.release()
	if held {
		t.Errorf("a starting proxy found pid %d holding the name, want no proxy found", pid)
	}
	// Another user's process is no proxy: waiting for it would let any
	// local user keep the proxy from serving.
	select {
	case <-claim.NoProxyHolds():
	default:
		t.Error("a starting proxy waits for another user's process")
	}
	if !strings.Contains(logs.String(), "held by a process of another user") {
		t.Errorf("the squatter was not said to be another user's:\n%s", logs)
	}
	stop()
	for deadline := time.Now().Add(5 * time.Second); !claim.holding(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the proxy did not take the name once the other user's process was gone")
		}
	}
}

// A --cleanup that found the holder keeps its connection while it removes
// the rules; the holder puts them back once it ends, not at its next full
// sync, and not while it runs.
func TestInstanceRepairsWhenCleanupEnds(t *testing.T) {
	useOwnInstanceName(t)
	logs := captureKlog(t)

	first, repaired := holderCountingRepairs(t)
	held, pid, done := holderDuringCleanup()
	if !held || pid != os.Getpid() {
		t.Fatalf("--cleanup's look: held %v, pid %d; want true, %d", held, pid, os.Getpid())
	}
	waitFor(t, "the holder to log the cleanup", func() bool { return strings.Contains(logs.String(), "found this one") })
	select {
	case <-repaired:
		t.Fatal("the holder repaired while the cleanup runs")
	default:
	}
	done()
	select {
	case <-repaired:
	case <-time.After(5 * time.Second):
		t.Fatalf("the holder did not repair when the cleanup ended:\n%s", logs)
	}
	if first.othersRunning() {
		t.Error("a cleanup was counted as a proxy running")
	}
}

// A holder that exits between the claim's listen, which found the name
// taken, and its dial leaves the name free: the claim takes it at once,
// and does not stop waiting before it holds it. It said at once that no
// proxy held the name while not holding it, so a third proxy starting in
// the next 5 s took the name and ran too: two proxies rewrote each other's
// rules, for good (the second never waited again).
func TestClaimTakesTheNameItsHolderLeftBeforeTheDial(t *testing.T) {
	useOwnInstanceName(t)
	savedEvery := instanceRetryEvery
	instanceRetryEvery = time.Hour // only an immediate take passes
	t.Cleanup(func() { instanceRetryEvery, nameFoundTaken = savedEvery, nil })
	captureKlog(t)

	holder, err := net.ListenUnix("unix", &net.UnixAddr{Name: instanceSocket, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	nameFoundTaken = func() { holder.Close() } // the holder exits now
	second, _, _ := claimInstance()
	defer second.release()
	nameFoundTaken = nil
	waitFor(t, "the second claim to take the name its holder left", func() bool {
		select {
		case <-second.NoProxyHolds():
			return true
		default:
			return false
		}
	})
	if !second.holding() {
		t.Fatal("the second claim stopped waiting without holding the name")
	}
	third, held, _ := claimInstance()
	defer third.release()
	select {
	case <-third.NoProxyHolds():
		t.Fatalf("a third claim (held %v) does not wait for the second: both would program the rules", held)
	default:
	}
}

// A socket bound to the name that does not listen (any local user can bind
// an abstract name) refuses every dial as an exited holder does, but holds
// the name: it is no proxy, and the claim does not wait for it.
func TestClaimDoesNotWaitForABoundSocketThatDoesNotListen(t *testing.T) {
	useOwnInstanceName(t)
	captureKlog(t)
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if err := unix.Bind(fd, &unix.SockaddrUnix{Name: instanceSocket}); err != nil {
		t.Fatal(err)
	}
	claim, held, _ := claimInstance()
	defer claim.release()
	select {
	case <-claim.NoProxyHolds():
	default:
		t.Fatalf("the claim (held %v, holding %v) waits for a socket that only binds the name", held, claim.holding())
	}
}
