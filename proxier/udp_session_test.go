package proxier

import (
	"errors"
	"fmt"
	"math"
	"net/netip"
	"os"
	"slices"
	"testing"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/test/harness/netns"
)

// The table keeps sessions newest first; oldest is what expiry and the cap
// take first.
func TestUDPSessionTableOrder(t *testing.T) {
	type op struct {
		do string // add, touch, remove
		id int
	}
	for _, tc := range []struct {
		name string
		ops  []op
		want []int // oldest first
	}{
		{"adds", []op{{"add", 1}, {"add", 2}, {"add", 3}}, []int{1, 2, 3}},
		{"touch the oldest", []op{{"add", 1}, {"add", 2}, {"add", 3}, {"touch", 1}}, []int{2, 3, 1}},
		{"touch the middle", []op{{"add", 1}, {"add", 2}, {"add", 3}, {"touch", 2}}, []int{1, 3, 2}},
		{"touch the newest", []op{{"add", 1}, {"add", 2}, {"touch", 2}}, []int{1, 2}},
		{"remove the oldest", []op{{"add", 1}, {"add", 2}, {"add", 3}, {"remove", 1}}, []int{2, 3}},
		{"remove the newest", []op{{"add", 1}, {"add", 2}, {"add", 3}, {"remove", 3}}, []int{1, 2}},
		{"remove the middle", []op{{"add", 1}, {"add", 2}, {"add", 3}, {"remove", 2}}, []int{1, 3}},
		{"remove all", []op{{"add", 1}, {"add", 2}, {"remove", 2}, {"remove", 1}}, nil},
		{"re-add", []op{{"add", 1}, {"add", 2}, {"remove", 1}, {"add", 1}}, []int{2, 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tab := newUDPSessionTable()
			byID := map[int]*udpSession{}
			for now, o := range tc.ops {
				switch o.do {
				case "add":
					s := &udpSession{client: netip.AddrPortFrom(loopbackSource(o.id), 53), fd: 100 + o.id}
					byID[o.id] = s
					tab.add(s, int64(now))
				case "touch":
					tab.touch(byID[o.id], int64(now))
				case "remove":
					tab.remove(byID[o.id])
				}
			}
			var got, back []int
			tab.each(func(s *udpSession) { got = append(got, s.fd-100) })
			for s := tab.newest; s != nil; s = s.older {
				back = append(back, s.fd-100)
			}
			slices.Reverse(back)
			if !slices.Equal(got, tc.want) || !slices.Equal(back, tc.want) {
				t.Fatalf("oldest first: %v (walked from the newest: %v), want %v", got, back, tc.want)
			}
			if tab.len() != len(tc.want) || len(tab.byFD) != len(tc.want) {
				t.Fatalf("indexes hold %d and %d sessions, want %d", tab.len(), len(tab.byFD), len(tc.want))
			}
			for _, id := range tc.want {
				s := byID[id]
				if tab.get(s.client) != s || tab.getFD(s.fd) != s {
					t.Fatalf("session %d not found by client or descriptor", id)
				}
			}
			if len(tc.want) > 0 && (tab.oldest.fd-100 != tc.want[0] || tab.newest.fd-100 != tc.want[len(tc.want)-1]) {
				t.Fatalf("oldest %d, newest %d; want %d, %d", tab.oldest.fd-100, tab.newest.fd-100, tc.want[0], tc.want[len(tc.want)-1])
			}
		})
	}
}

// each survives the callback removing the session it was given (expiry
// and Close do).
func TestUDPSessionTableEachRemoves(t *testing.T) {
	tab := newUDPSessionTable()
	for i := range 5 {
		tab.add(&udpSession{client: netip.AddrPortFrom(loopbackSource(i), 1), fd: i}, int64(i))
	}
	var seen []int
	tab.each(func(s *udpSession) {
		seen = append(seen, s.fd)
		if s.fd%2 == 0 {
			tab.remove(s)
		}
	})
	if fmt.Sprint(seen) != "[0 1 2 3 4]" || tab.len() != 2 || tab.oldest.fd != 1 || tab.newest.fd != 3 {
		t.Fatalf("saw %v, left %d sessions (oldest %d, newest %d); want all seen, 1 and 3 left", seen, tab.len(), tab.oldest.fd, tab.newest.fd)
	}
}

func TestUDPBudget(t *testing.T) {
	b := newUDPBudget(2)
	for i := range 2 {
		if !b.acquire() {
			t.Fatalf("a budget of 2 refused acquisition %d", i+1)
		}
	}
	if b.acquire() {
		t.Fatal("a budget of 2 gave a third slot")
	}
	b.release()
	if !b.acquire() {
		t.Fatal("a released slot was not given again")
	}
	if got := b.used.Load(); got != 2 {
		t.Fatalf("used %d, want 2", got)
	}
}

func TestUDPDescriptorShare(t *testing.T) {
	for _, tc := range []struct {
		nofile uint64
		want   int
	}{{1024, 512}, {20000, 10000}, {1 << 20, 1 << 19}, {1 << 62, 1 << 30}} {
		if got := udpDescriptorShare(tc.nofile); got != tc.want {
			t.Errorf("udpDescriptorShare(%d) = %d, want %d", tc.nofile, got, tc.want)
		}
	}
	p := newTestProxier(t, Options{UDPMaxSessions: 1 << 30})
	want := udpDescriptorShare(nofileLimit())
	if kp, err := readKernelPortsFromProc(); err == nil && len(allowedPorts(kp, nil)) > 0 {
		want = min(want, udpPortShare(len(allowedPorts(kp, nil)))) // TestUDPCapsWithinTheEphemeralPorts
	}
	if got := p.sockCfg.udpBudget.limit; got != int64(want) {
		t.Fatalf("total UDP session cap %d with a huge --udp-max-sessions, want half the descriptor limit (or of the ephemeral ports), %d", got, want)
	}
}

// The descriptor limit lowers the default per-port cap with the total: a
// limit of 20,000 made the total 10,000 and left the per-port cap at
// 16,384, so one flooded port took every session and a quiet port's new
// clients were dropped (1,500 forged sources at nofile 2,000: the good
// Service's first 5 clients dropped). A per-port cap given (perPort > 0) is
// held to the total only: scaled too, a given 10 became 1 and a Service
// with two clients evicted at every datagram.
func TestUDPCapsScaleWithTheDescriptorLimit(t *testing.T) {
	for _, tc := range []struct {
		perPort, limit int
		nofile         uint64
		wantPerPort    int
		wantTotal      int
	}{
		{0, DefaultUDPMaxSessions, 1 << 20, 16384, 65536}, // room: the defaults
		{0, DefaultUDPMaxSessions, 20000, 2500, 10000},    // a quarter, as the defaults
		{0, DefaultUDPMaxSessions, 2000, 250, 1000},
		{0, 1000, 1 << 20, 1000, 1000}, // the default per-port cap is held to a smaller total given
		{50, 80, 20000, 50, 80},        // the flags' own caps, under the share: as given
		{100, 80, 1 << 20, 80, 80},     // a per-port cap above the total is the total
		{1, 65536, 4, 1, 2},
		// A per-port cap given, at or below the lowered total, needs no
		// scaling.
		{10, DefaultUDPMaxSessions, 20000, 10, 10000},
		{2500, DefaultUDPMaxSessions, 20000, 2500, 10000},
		{10000, DefaultUDPMaxSessions, 20000, 10000, 10000},
		// Above it, it is the total.
		{DefaultUDPMaxSessionsPerPort, DefaultUDPMaxSessions, 20000, 10000, 10000},
		{1_000_000_000_000_000, DefaultUDPMaxSessions, 20000, 10000, 10000},
		{math.MaxInt64, math.MaxInt64, 20000, 10000, 10000},
		{math.MaxInt64, DefaultUDPMaxSessions, 20000, 10000, 10000},
	} {
		perPort, total := udpCaps(tc.perPort, tc.limit, tc.nofile, 0)
		if perPort != tc.wantPerPort || total != tc.wantTotal {
			t.Errorf("udpCaps(%d, %d, nofile %d) = %d per port, %d in total; want %d, %d",
				tc.perPort, tc.limit, tc.nofile, perPort, total, tc.wantPerPort, tc.wantTotal)
		}
	}
}

// Every session's backend socket takes a local port from the ephemeral
// range of the proxier's namespace (a connected UDP socket's port is its
// own, whatever its peer), so the total cap is held to half of the range's
// ports, as it is to half the descriptors: the rest stays for the node's
// own UDP clients, and the port's own oldest idle session gives way at the
// cap. Above the range, the ports ran out first, and every new client of
// every UDP Service was dropped ("connect: resource temporarily
// unavailable") until the flood's sessions idled out: a range of 100
// ports, 150 forged sources to one Service with --udp-timeout 30s, and
// another Service's first client dropped, both caps far away.
func TestUDPCapsWithinTheEphemeralPorts(t *testing.T) {
	kp, err := readKernelPortsFromProc()
	if err != nil {
		t.Skipf("cannot read the ephemeral range: %v", err)
	}
	p := newTestProxier(t, Options{})
	share := max(1, kp.Ephemeral.Size/2)
	if got := p.sockCfg.udpBudget.limit; got > int64(share) {
		t.Errorf("total UDP session cap %d with an ephemeral range of %d ports (%s), want at most half, %d",
			got, kp.Ephemeral.Size, kp.Ephemeral, share)
	}
	if got := p.sockCfg.udpMaxSessionsPerPort; got > share/4+1 {
		t.Errorf("per-port UDP session cap %d with %d ephemeral ports, want it scaled with the total (at most %d)",
			got, kp.Ephemeral.Size, share/4+1)
	}
}

// The caps are held to the ports the sessions' sockets bind, read once
// (sessionPorts) in the namespace the proxier is made in: a range of 100
// ports less 10 reserved gives sessions 90 ports and a total cap of 45,
// far below the descriptors' share.
func TestUDPCapsHeldToTheSessionPorts(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root for a network namespace")
	}
	netns.Require(t, "ip")
	ns := netns.New(t).NS("caps")
	ns.Sysctl("net.ipv4.ip_local_port_range", "40000 40099")
	ns.Sysctl("net.ipv4.ip_local_reserved_ports", "40010-40019")
	var p *Proxier
	if err := ns.Do(func() error { p = newTestProxier(t, Options{}); return nil }); err != nil {
		t.Fatal(err)
	}
	if got := p.sockCfg.udpPorts.count(); got != 90 {
		t.Errorf("session ports: %d, want the 90 of 40000-40099 less 40010-40019", got)
	}
	if got, want := p.sockCfg.udpBudget.limit, int64(udpPortShare(90)); got != want {
		t.Errorf("total UDP session cap %d, want half the 90 session ports, %d", got, want)
	}
}

// The ephemeral ports' share holds the total as the descriptors' does, and
// lowers the default per-port cap with it.
func TestUDPCapsScaleWithTheEphemeralPorts(t *testing.T) {
	for _, tc := range []struct {
		perPort, limit int
		nofile         uint64
		ephemeral      int
		wantPerPort    int
		wantTotal      int
	}{
		{0, DefaultUDPMaxSessions, 1 << 20, 0, 16384, 65536},         // unknown range: no bound
		{0, DefaultUDPMaxSessions, 1 << 20, 28232, 3529, 14116},      // the default range, 32768-60999
		{0, DefaultUDPMaxSessions, 1 << 20, 64512, 8064, 32256},      // 1024-65535
		{0, DefaultUDPMaxSessions, 20000, 28232, 2500, 10000},        // the descriptors bind first
		{0, DefaultUDPMaxSessions, 1 << 20, 100, 12, 50},             // a small range
		{1000, DefaultUDPMaxSessions, 1 << 20, 28232, 1000, 14116},   // a per-port cap given, within the total
		{20000, DefaultUDPMaxSessions, 1 << 20, 28232, 14116, 14116}, // above it: the total
		{0, 1000, 1 << 20, 28232, 1000, 1000},                        // a total given, within the share
		{0, DefaultUDPMaxSessions, 1 << 20, 1, 1, 1},
	} {
		perPort, total := udpCaps(tc.perPort, tc.limit, tc.nofile, tc.ephemeral)
		if perPort != tc.wantPerPort || total != tc.wantTotal {
			t.Errorf("udpCaps(%d, %d, nofile %d, %d ephemeral ports) = %d per port, %d in total; want %d, %d",
				tc.perPort, tc.limit, tc.nofile, tc.ephemeral, perPort, total, tc.wantPerPort, tc.wantTotal)
		}
	}
	// The count is the session ports' (one reading of the range for both).
	k := &fakeKernelPorts{kp: kernelPorts{Ephemeral: PortRange{Base: 32768, Size: 28232}, Reserved: []PortRange{{Base: 10249, Size: 2}, {Base: 40000, Size: 100}, {Base: 60990, Size: 20}}}}
	if got, want := newSessionPorts(k.read, 0).count(), 28232-100-10; got != want {
		t.Errorf("ephemeral ports less reserved: %d, want %d", got, want)
	}
	k.err = errors.New("no /proc")
	if got := newSessionPorts(k.read, 0).count(); got != 0 {
		t.Errorf("ephemeral ports of a range that cannot be read: %d, want 0 (unknown: no bound)", got)
	}
}

// Looking for ready sockets when the idle deadline passes allocates
// nothing (a closure made per look was an allocation per deadline).
func TestUDPPollerReadyAllocatesNothing(t *testing.T) {
	p, err := newUDPPoller()
	if err != nil {
		t.Fatal(err)
	}
	defer p.close()
	if n := testing.AllocsPerRun(100, func() { p.ready() }); n != 0 {
		t.Fatalf("ready: %v allocations, want 0", n)
	}
}
