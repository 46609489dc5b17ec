package proxier

import (
	"fmt"
	"net"
	"net/netip"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/internal/mono"
)

// evictPorts are n UDP service ports on loopback sharing one proxier's
// configuration: a total cap of total sessions, each port's cap perPort,
// and a registry the ports are found in at the cap. Their relay loops do
// not run: the test hands each client datagram to forward itself.
func evictPorts(t *testing.T, n, perPort, total int) []*udpProxySocket {
	t.Helper()
	backend := startUDPEcho(t, "127.0.0.1:0", "").LocalAddr().(*net.UDPAddr).AddrPort()
	cfg := &socketConfig{
		dialTimeouts: defaultDialTimeouts, udpIdleTimeout: time.Minute, metrics: NewMetrics(),
		udpMaxSessionsPerPort: perPort, udpBudget: newUDPBudget(total), conns: &connRegistry{},
	}
	var ports []*udpProxySocket
	for range n {
		ports = append(ports, newInflightPortWith(t, cfg, backend).sock)
	}
	return ports
}

// evictClient is the i-th client ip:port of port p (distinct across ports).
func evictClient(p, i int) netip.AddrPort {
	return netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 20, byte(p), byte(i)}), 5353)
}

// clients lists the clients holding a session on s, oldest first.
func clients(s *udpProxySocket) []netip.AddrPort {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []netip.AddrPort
	s.sessions.each(func(sess *udpSession) { out = append(out, sess.client) })
	return out
}

// delay makes every session of s hold a client datagram a fault delays
// for an hour: none is idle, none may be given up.
func delay(s *udpProxySocket) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sessions.each(func(sess *udpSession) { sess.upDeferredUntil = mono.Now() + int64(time.Hour) })
}

// At the total cap a port with no session of its own takes one from
// another port: with a cap of 4, four clients of one port held every
// session and the other port's first client was dropped.
func TestUDPTotalCapTakesAnotherPortsSession(t *testing.T) {
	ports := evictPorts(t, 2, 16, 4)
	a, b := ports[0], ports[1]
	for i := range 4 {
		a.forward(evictClient(0, i), []byte("q"), nil)
	}
	b.forward(evictClient(1, 0), []byte("q"), nil)
	if got := clients(b); len(got) != 1 || b.capDropped.value() != 0 {
		t.Fatalf("port b's first client at the total cap: sessions %v, %v dropped; want it served", got, b.capDropped.value())
	}
	if got := clients(a); len(got) != 3 || got[0] != evictClient(0, 1) {
		t.Fatalf("port a: sessions %v; want 3, its oldest (client 0) given up", got)
	}
	if used := a.cfg.udpBudget.used.Load(); used != 4 || a.held.Load() != 3 || b.held.Load() != 1 {
		t.Fatalf("budget used %d, held %d and %d; want 4, 3, 1", used, a.held.Load(), b.held.Load())
	}
}

// The port holding the most sessions gives up its oldest idle one, not the
// oldest idle session of all ports: under a flood of forged sources those
// are the long-lived clients of quiet Services.
func TestUDPTotalCapBiggestHolderPays(t *testing.T) {
	ports := evictPorts(t, 3, 16, 4)
	quiet, flooded, newcomer := ports[0], ports[1], ports[2]
	quiet.forward(evictClient(0, 0), []byte("q"), nil) // the oldest of all
	for i := range 3 {
		flooded.forward(evictClient(1, i), []byte("q"), nil)
	}
	newcomer.forward(evictClient(2, 0), []byte("q"), nil)
	if got := clients(quiet); len(got) != 1 {
		t.Fatalf("the quiet port's only (and oldest) session was taken: %v", got)
	}
	if got := clients(flooded); len(got) != 2 || got[0] != evictClient(1, 1) {
		t.Fatalf("the biggest holder: sessions %v; want 2, its oldest (client 0) given up", got)
	}
	if got := clients(newcomer); len(got) != 1 {
		t.Fatalf("the new port's client was not served: %v", got)
	}
}

// When none of the biggest holder's oldest sessions is idle (a fault
// delays a client datagram of each), the next biggest gives one up; when
// no port has one, the new client's datagram is dropped, counted.
func TestUDPTotalCapPassesOverDelayedSessions(t *testing.T) {
	ports := evictPorts(t, 3, 16, 4)
	small, big, newcomer := ports[0], ports[1], ports[2]
	small.forward(evictClient(0, 0), []byte("q"), nil)
	for i := range 3 {
		big.forward(evictClient(1, i), []byte("q"), nil)
	}
	delay(big)
	newcomer.forward(evictClient(2, 0), []byte("q"), nil)
	if len(clients(big)) != 3 || len(clients(small)) != 0 || len(clients(newcomer)) != 1 {
		t.Fatalf("sessions: big %v, small %v, new %v; want 3, 0 (the next biggest gave up its idle one), 1",
			clients(big), clients(small), clients(newcomer))
	}
	delay(newcomer)
	small.forward(evictClient(0, 1), []byte("q"), nil)
	if len(clients(small)) != 0 || small.capDropped.value() != 1 {
		t.Fatalf("no idle session anywhere: small holds %v, %v dropped; want none and 1", clients(small), small.capDropped.value())
	}
	if used := small.cfg.udpBudget.used.Load(); used != 4 {
		t.Fatalf("budget used %d, want 4", used)
	}
}

// Two ports at a total cap of one take the session from each other at
// every new client, at once, from two goroutines: neither waits on the
// other's mutex while holding its own (no deadlock), and the budget, the
// tables and their counts agree at the end.
func TestUDPTotalCapPortsEvictEachOther(t *testing.T) {
	ports := evictPorts(t, 2, 16, 1)
	const rounds = 300
	var wg sync.WaitGroup
	for p, s := range ports {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range rounds {
				s.forward(evictClient(p, i%250), []byte(fmt.Sprint(i)), nil)
			}
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		t.Fatal("two ports evicting from each other did not finish in 60 s (deadlock?)")
	}
	a, b := ports[0], ports[1]
	held := len(clients(a)) + len(clients(b))
	if used := a.cfg.udpBudget.used.Load(); used != int64(held) || held != 1 ||
		a.held.Load() != int64(len(clients(a))) || b.held.Load() != int64(len(clients(b))) {
		t.Fatalf("budget used %d, sessions %d + %d (held %d + %d); want 1 in all", used,
			len(clients(a)), len(clients(b)), a.held.Load(), b.held.Load())
	}
	if ev := a.evicted.value(); ev == 0 {
		t.Fatal("no session was given up across the ports")
	}
}

// The scan for the biggest holders at the total cap, over 10,000 UDP
// service ports: what a port pays at most once per udpHolderRescan.
func BenchmarkUDPHolderRanking10k(b *testing.B) {
	reg := &connRegistry{}
	for i := range 10000 {
		s := &udpProxySocket{}
		s.held.Store(int64(i * 7919 % 10007))
		reg.udpSockets.Store(s, struct{}{})
	}
	b.ReportAllocs()
	var r *udpHolderRanking
	for b.Loop() {
		r = rankUDPHolders(reg, 0)
	}
	if r.ports[0].held.Load() < r.ports[1].held.Load() || r.ports[3] == nil {
		b.Fatalf("ranking out of order: %d, %d", r.ports[0].held.Load(), r.ports[1].held.Load())
	}
}

// The ranking keeps the biggest holders in order, and ports holding none
// while there is room.
func TestUDPHolderRanking(t *testing.T) {
	reg := &connRegistry{}
	held := []int64{3, 9, 0, 7, 9, 1}
	socks := make([]*udpProxySocket, len(held))
	for i, n := range held {
		socks[i] = &udpProxySocket{}
		socks[i].held.Store(n)
		reg.udpSockets.Store(socks[i], struct{}{})
	}
	var got []int64
	for _, s := range rankUDPHolders(reg, 0).ports {
		got = append(got, s.held.Load())
	}
	if fmt.Sprint(got) != "[9 9 7 3]" {
		t.Fatalf("ranking %v, want [9 9 7 3]", got)
	}
	few := &connRegistry{}
	few.udpSockets.Store(socks[2], struct{}{})
	if r := rankUDPHolders(few, 0); r.ports[0] != socks[2] || r.ports[1] != nil {
		t.Fatalf("one port holding none: ranking %v, want it alone", r.ports)
	}
}

// A port at a cap that closes its own oldest idle session for a new client
// hands that session's slot in the budget to the new one: no other port can
// take it between the two. Released and taken again, another port's new
// client could slip in, and the port then closed a second session for one
// client (its own, or another port's: a quiet Service's long-lived client,
// for a flooded port that had idle sessions of its own).
func TestUDPOwnEvictionKeepsItsSlot(t *testing.T) {
	for _, tc := range []struct {
		name           string
		perPort, total int
	}{{"the total cap", 16, 4}, {"the port's cap", 4, 4}} {
		t.Run(tc.name, func(t *testing.T) {
			s := evictPorts(t, 1, tc.perPort, tc.total)[0]
			b := s.cfg.udpBudget
			for i := range 4 {
				s.forward(evictClient(0, i), []byte("q"), nil)
			}
			// Another port's new client, trying all along: at the cap it
			// gets a slot only if one is free.
			stop := make(chan struct{})
			var stolen atomic.Int64
			var wg sync.WaitGroup
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					select {
					case <-stop:
						return
					default:
					}
					if b.acquire() {
						stolen.Add(1)
						b.release()
					}
				}
			}()
			const clients = 3000
			for i := range clients {
				s.forward(evictClient(0, 4+i%250), []byte("q"), nil)
			}
			close(stop)
			wg.Wait()
			if n := stolen.Load(); n != 0 {
				t.Errorf("another port took a slot %d times while the port evicted its own sessions for %d new clients", n, clients)
			}
			if used, held := b.used.Load(), s.held.Load(); used != 4 || held != 4 || s.capDropped.value() != 0 {
				t.Errorf("budget used %d, sessions %d, %v dropped; want 4, 4, 0", used, held, s.capDropped.value())
			}
		})
	}
}

// Under churn (new clients on every port at once, sessions idling out,
// ports closing, or handing their sessions over to a new socket as a
// reopen does, or to another port's running one) the budget counts exactly
// the sessions held, never more than the cap: whenever no client's
// datagram is half forwarded, used is the sessions held (and the slots
// given for the next), at most the limit.
func TestUDPBudgetExactUnderChurn(t *testing.T) {
	for _, tc := range []struct{ perPort, total int }{{16, 1}, {16, 2}, {1, 2}, {2, 3}} {
		t.Run(fmt.Sprintf("per-port %d, total %d", tc.perPort, tc.total), func(t *testing.T) {
			const nports = 3
			backend := startUDPEcho(t, "127.0.0.1:0", "").LocalAddr().(*net.UDPAddr).AddrPort()
			cfg := &socketConfig{
				dialTimeouts: defaultDialTimeouts, udpIdleTimeout: 5 * time.Millisecond, metrics: NewMetrics(),
				udpMaxSessionsPerPort: tc.perPort, udpBudget: newUDPBudget(tc.total), conns: &connRegistry{},
			}
			b := cfg.udpBudget
			var slots [nports]atomic.Pointer[udpProxySocket]
			for p := range slots {
				slots[p].Store(newInflightPortWith(t, cfg, backend).sock)
			}
			// between holds the clients between two datagrams (write
			// locked) while check looks.
			var between sync.RWMutex
			check := func() {
				t.Helper()
				between.Lock()
				defer between.Unlock()
				held := int64(0)
				for p := range slots {
					s := slots[p].Load()
					s.mu.Lock()
					held += int64(s.sessions.len())
					if s.givenSlot {
						held++
					}
					if s.held.Load() != int64(s.sessions.len()) {
						t.Errorf("a port counts %d sessions held, its table %d", s.held.Load(), s.sessions.len())
					}
					s.mu.Unlock()
				}
				if used := b.used.Load(); used != held || used > b.limit {
					t.Fatalf("budget used %d of %d, sessions held (and slots given) %d; want them equal, at most the limit",
						used, b.limit, held)
				}
			}
			stop := make(chan struct{})
			var wg sync.WaitGroup
			halt := sync.OnceFunc(func() { close(stop); wg.Wait() })
			t.Cleanup(halt) // also when check fails
			var forwarded atomic.Int64
			for p := range slots {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := 0; ; i++ {
						select {
						case <-stop:
							return
						default:
						}
						between.RLock()
						s := slots[p].Load()
						// Few clients, the same on every port: a session
						// handed to another port may meet its client's own.
						s.forward(evictClient(0, i%4), []byte("q"), nil)
						if i%16 == 0 {
							s.expireIdle()
						}
						between.RUnlock()
						forwarded.Add(1)
					}
				}()
			}
			for round := range 150 {
				// Some churn between looks: the clients' datagrams
				// since the last one.
				for next := forwarded.Load() + 10; forwarded.Load() < next; {
					runtime.Gosched()
				}
				check()
				if round%5 == 4 {
					// The port's socket closes (its Service deleted), or
					// hands its sessions over: to the one that replaces
					// it (a reopen), or to another port's running socket
					// (a retired external socket's), which closes those
					// beyond its cap and those of clients it has a
					// session of already. Clients keep sending meanwhile.
					p := round / 5 % nports
					old, next := slots[p].Load(), newInflightPortWith(t, cfg, backend).sock
					switch round / 15 % 3 {
					case 0:
						old.Close()
					case 1:
						h, _ := old.closeHandingOver()
						adopt(next, h)
					case 2:
						h, _ := old.closeHandingOver()
						adopt(slots[(p+1)%nports].Load(), h)
					}
					slots[p].Store(next)
				}
			}
			halt()
			check()
			if slots[0].Load().evicted.value() == 0 { // one series: every socket has the same name
				t.Fatal("no session was evicted: the churn never reached a cap")
			}
		})
	}
}
