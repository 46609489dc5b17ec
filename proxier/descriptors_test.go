package proxier

import (
	"fmt"
	"net"
	"os"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/relay"
)

// A sync opens proxy sockets only while RLIMIT_NOFILE keeps descriptors
// for the rest (descriptorReserve): the others fail as a taken port does,
// with the cause, and are retried. With 150 Services of TCP and UDP under
// `ulimit -n 256`, the listeners took every descriptor, every rule write
// failed, and nothing was served until a restart.
func TestSocketsLeaveDescriptorsForTheRest(t *testing.T) {
	p := newTestProxier(t, Options{})
	logs := captureKlog(t)
	// Each open socket holds one more descriptor; the budget counts
	// again as its estimate (4 a socket) runs out, and stops once fewer
	// than 4 are left above the 64 kept and the connections' 64: at 69
	// in use, 33 sockets.
	base, counts := 36, 0
	p.fds.count = func() (int, int, bool) { counts++; return base + len(p.active), 200, true }
	for i := range 50 {
		p.OnServiceAdd(makeService(fmt.Sprintf("s%d", i), withClusterIP(fmt.Sprintf("10.96.1.%d", i))))
	}
	p.Sync()
	if got := len(p.active); got != 33 {
		t.Fatalf("%d proxy sockets open, want 33", got)
	}
	// Once a count found no room, the sockets left are refused without
	// counting again: each counted twice, a sync that could not open
	// thousands read /proc/self/fd thousands of times.
	t.Logf("%d counts", counts)
	if counts > 20 {
		t.Errorf("%d counts of the descriptors for 50 sockets", counts)
	}
	failures := p.DebugServices()
	var opens int
	for _, f := range p.lastFailed {
		if strings.HasPrefix(f, "open ") {
			opens++
		}
	}
	if opens != 17 {
		t.Errorf("%d opens left to retry, want 17: %q", opens, p.lastFailed)
	}
	if !slices.ContainsFunc(failures, func(r DebugServicePort) bool { return strings.Contains(r.Error, "no descriptor to spare") }) {
		t.Errorf("/debug/services names no descriptor shortage: %+v", failures)
	}
	// One line says the shortage in full and one how many more it
	// refused: a line per socket was thousands per retry.
	klog.Flush()
	// klog writes an error line once per severity below it: count lines
	// once each.
	shortage := map[string]bool{}
	for _, line := range strings.Split(logs.String(), "\n") {
		if strings.Contains(line, "no descriptor to spare") {
			shortage[line] = true
		}
	}
	if n := len(shortage); n != 2 {
		t.Errorf("%d log lines name the shortage for 17 refused sockets, want 2 (the first, the count of the rest):\n%s", n, logs)
	}
	if !strings.Contains(logs.String(), "count=16") {
		t.Errorf("no line counts the 16 other refusals:\n%s", logs)
	}
	// Descriptors freed (connections ended): the retry opens the rest.
	base = 10
	p.Sync()
	if got := len(p.active); got != 50 {
		t.Fatalf("%d proxy sockets open after descriptors were freed, want 50", got)
	}
}

// descriptorsInUse counts what /proc/self/fd lists, less its own.
func TestDescriptorsInUseCounts(t *testing.T) {
	before, limit, ok := descriptorsInUse()
	if !ok || limit <= 0 {
		t.Fatalf("descriptorsInUse: %d, %d, %v", before, limit, ok)
	}
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	if want := len(entries) - 1; before != want { // ReadDir's own
		t.Errorf("counted %d in use, /proc/self/fd lists %d", before, want)
	}
	var fds []int
	for range 100 {
		fd, err := unix.Open("/dev/null", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		fds = append(fds, fd)
	}
	after, _, _ := descriptorsInUse()
	for _, fd := range fds {
		unix.Close(fd)
	}
	if after != before+100 {
		t.Errorf("counted %d after opening 100 more, want %d", after, before+100)
	}
}

// The NodePorts a sync holds (claim.go: a bound socket each) come out of
// the same budget as its proxy sockets. They were opened after every
// socket of the sync without it: at 10,000 Services (1,000 of them
// NodePort) under a limit of 15,000, the listeners stopped at the budget
// (14,060 in use) and the holds took 824 more of the reserve, past the
// connections' ceiling (14,063), so every client of every Service was reset
// (sweep 10). A NodePort not held for want of descriptors is retried as one
// another process holds.
func TestNodePortHoldsStayWithinDescriptorBudget(t *testing.T) {
	p := newTestProxier(t, Options{ClaimNodePorts: true})
	start, _, ok := descriptorsInUse()
	if !ok {
		t.Skip("no /proc/self/fd")
	}
	// What this process holds besides the test's sockets counts as base.
	base, limit := 136, 300 // room for 36 of the 60 NodePort Services' listeners (128 kept)
	inUse := func() int { n, _, _ := descriptorsInUse(); return base + n - start }
	p.fds.count = func() (int, int, bool) { return inUse(), limit, true }
	ceiling := limit - descriptorReserve(limit)
	var held []net.Listener
	for i := range 60 {
		// A free port for each NodePort, held by nobody once the loop ends.
		ln, err := net.Listen("tcp", ":0")
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, ln)
		port := ln.Addr().(*net.TCPAddr).Port
		p.OnServiceAdd(makeService(fmt.Sprintf("s%d", i), withClusterIP(fmt.Sprintf("10.96.1.%d", i)), withNodePort(int32(port))))
	}
	for _, ln := range held {
		ln.Close()
	}
	p.Sync()
	if n := inUse(); n > ceiling {
		t.Errorf("%d descriptors in use after the sync, past the %d that sockets may take of the limit %d (%d proxy sockets open)",
			n, ceiling, limit, len(p.active))
	}
	if len(p.active) == 0 {
		t.Fatal("no proxy socket opened")
	}
	// Descriptors freed: the retry opens the other sockets and holds every NodePort.
	base = 0
	p.Sync()
	p.Sync()
	if got := len(p.active); got != 60 {
		t.Fatalf("%d proxy sockets open after descriptors were freed, want 60", got)
	}
	for name, ap := range p.active {
		if ap.claimsMissing || len(ap.claims) != 1 {
			t.Errorf("%s: NodePort not held after descriptors were freed (%d claims)", name, len(ap.claims))
		}
	}
}

// Proxy sockets leave the connections a share of their own: the
// listeners' budget ended at the connections' ceiling, so one Service of
// 3,000 ports under a limit of 2,000 (or a cluster with more service ports
// than the limit) filled the descriptors up to it, and then every client
// of every Service, the ones served before included, was reset at the
// ceiling: 189 of 200 connections to an untouched Service (sweep 10).
func TestProxySocketsLeaveConnectionsTheirShare(t *testing.T) {
	p := newTestProxier(t, Options{})
	start, _, ok := descriptorsInUse()
	if !ok {
		t.Skip("no /proc/self/fd")
	}
	base, limit := 100, 400
	inUse := func() int { n, _, _ := descriptorsInUse(); return base + n - start }
	p.fds.count = func() (int, int, bool) { return inUse(), limit, true }
	for i := range 300 {
		p.OnServiceAdd(makeService(fmt.Sprintf("s%d", i), withClusterIP(fmt.Sprintf("10.96.%d.%d", 1+i/250, i%250))))
	}
	p.Sync()
	if len(p.active) == 0 || len(p.active) == 300 {
		t.Fatalf("%d of 300 proxy sockets open, want the budget to stop them", len(p.active))
	}
	ceiling := limit - descriptorReserve(limit)
	if n, share := inUse(), descriptorReserve(limit); ceiling-n < share {
		t.Errorf("%d descriptors in use after the sync: %d left below the connections' ceiling %d, want at least %d (%d proxy sockets open)",
			n, ceiling-n, ceiling, share, len(p.active))
	}
}

// The descriptor ceiling follows RLIMIT_NOFILE when it changes under a
// running proxy (prlimit --pid): it was set once, at start, so a limit
// lowered from 20,000 to 64 left the ceiling at 18,750, connections took
// every descriptor, and the metrics server could not accept (`accept4: too
// many open files` each second) while README promises the top
// max(64, limit/16) stay free for it. A sync sets it again from the new
// limit; an unchanged limit leaves it alone (tests lower it by hand).
func TestDescriptorCeilingFollowsTheLimit(t *testing.T) {
	var r unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &r); err != nil {
		t.Fatal(err)
	}
	if r.Cur < 2048 {
		t.Skipf("soft open-file limit %d: too low to lower", r.Cur)
	}
	setDescriptorCeiling()
	t.Cleanup(func() {
		_ = unix.Setrlimit(unix.RLIMIT_NOFILE, &r)
		setDescriptorCeiling()
	})
	if got, want := relay.DescriptorCeiling(), int(r.Cur)-descriptorReserve(int(r.Cur)); got != want {
		t.Fatalf("ceiling %d at start, want %d", got, want)
	}
	relay.SetDescriptorCeiling(100) // a test's own ceiling: kept while the limit stays
	followDescriptorLimit()
	if got := relay.DescriptorCeiling(); got != 100 {
		t.Fatalf("ceiling %d after a sync with the limit unchanged, want 100 kept", got)
	}
	lower := unix.Rlimit{Cur: 1024, Max: r.Max}
	if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &lower); err != nil {
		t.Fatal(err)
	}
	followDescriptorLimit()
	if got, want := relay.DescriptorCeiling(), 1024-64; got != want {
		t.Fatalf("ceiling %d after the limit fell to 1024, want %d", got, want)
	}
}
