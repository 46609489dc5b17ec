package loadbalancer

import (
	"errors"
	"net/netip"
	"slices"
	"testing"
	"time"
)

var (
	clientA = ip("192.0.2.10")
	clientB = ip("192.0.2.20")
)

func TestNextNoEndpoints(t *testing.T) {
	tests := []struct {
		name   string
		policy AffinityPolicy
		eps    []Endpoint
	}{
		{name: "no affinity, never had endpoints", policy: AffinityPolicy{}},
		{name: "ClientIP, never had endpoints", policy: clientIPPolicy(time.Minute)},
		{name: "none eligible", eps: []Endpoint{{Addr: backend(1), Serving: true}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			lb, _ := newTestBalancer(t)
			svc := svcName("empty")
			lb.SetAffinity(svc, tt.policy)
			lb.SetEndpoints(svc, tt.eps)
			if _, err := lb.ServicePort(svc).Next(clientA, false); !errors.Is(err, ErrNoEndpoints) {
				t.Errorf("Next error = %v, want ErrNoEndpoints", err)
			}
		})
	}
}

func TestNextRoundRobinOrder(t *testing.T) {
	lb, _ := newTestBalancer(t)
	svc := svcName("rr")
	lb.SetEndpoints(svc, readyEndpoints(3))
	sp := lb.ServicePort(svc)
	got := picks(t, sp, clientA, 7)
	want := []netip.AddrPort{backend(1), backend(2), backend(3), backend(1), backend(2), backend(3), backend(1)}
	if !slices.Equal(got, want) {
		t.Errorf("picks = %v, want %v", got, want)
	}
}

func TestNextFallsBackToServingTerminating(t *testing.T) {
	lb, _ := newTestBalancer(t)
	svc := svcName("draining")
	lb.SetEndpoints(svc, []Endpoint{
		{Addr: backend(1), Serving: true, Terminating: true},
		{Addr: backend(2), Serving: false, Terminating: true},
	})
	sp := lb.ServicePort(svc)
	for i, ep := range picks(t, sp, clientA, 3) {
		if ep != backend(1) {
			t.Errorf("pick %d = %v, want the serving+terminating %v", i, ep, backend(1))
		}
	}
	// A ready endpoint appearing takes over from the terminating one.
	if !lb.SetEndpoints(svc, []Endpoint{
		{Addr: backend(1), Serving: true, Terminating: true},
		{Addr: backend(3), Ready: true, Serving: true},
	}) {
		t.Fatal("SetEndpoints reported no change when a ready endpoint replaced the fallback")
	}
	if ep := mustNext(t, sp, clientA, false); ep != backend(3) {
		t.Errorf("after a ready endpoint appeared, pick = %v, want %v", ep, backend(3))
	}
}

// TestSetEndpointsChange covers what a change of endpoints does to the
// cursor and to pinned clients.
func TestSetEndpointsChange(t *testing.T) {
	tests := []struct {
		name        string
		next        []Endpoint
		wantChanged bool
		// wantNext is the round-robin pick for a new client after the update
		// (clientA consumed backend(1), so an untouched cursor is at backend(2)).
		wantNext netip.AddrPort
		// wantPinA is clientA's endpoint after the update (it was pinned to backend(1)).
		wantPinA netip.AddrPort
	}{
		{
			name:        "same set, same order: no change",
			next:        readyEndpoints(3),
			wantChanged: false,
			wantNext:    backend(2),
			wantPinA:    backend(1),
		},
		{
			name: "same set reordered: no change, cursor and pins kept",
			next: []Endpoint{
				{Addr: backend(3), Ready: true}, {Addr: backend(1), Ready: true}, {Addr: backend(2), Ready: true},
			},
			wantChanged: false,
			wantNext:    backend(2),
			wantPinA:    backend(1),
		},
		{
			name:        "not-ready endpoint added: eligible set unchanged",
			next:        append(readyEndpoints(3), Endpoint{Addr: backend(9)}),
			wantChanged: false,
			wantNext:    backend(2),
			wantPinA:    backend(1),
		},
		{
			name:        "endpoint added: cursor reset, pins kept",
			next:        readyEndpoints(4),
			wantChanged: true,
			wantNext:    backend(1),
			wantPinA:    backend(1),
		},
		{
			name:        "pinned endpoint removed: client re-pinned",
			next:        readyEndpoints(3)[1:],
			wantChanged: true,
			wantNext:    backend(2),
			// clientB took backend(2) at the reset cursor, so clientA gets the next one.
			wantPinA: backend(3),
		},
		{
			name: "pinned endpoint not ready any more: client re-pinned",
			next: []Endpoint{
				{Addr: backend(1), Serving: true}, {Addr: backend(2), Ready: true}, {Addr: backend(3), Ready: true},
			},
			wantChanged: true,
			wantNext:    backend(2),
			wantPinA:    backend(3),
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			lb, _ := newTestBalancer(t)
			svc := svcName("change")
			lb.SetAffinity(svc, clientIPPolicy(time.Hour))
			if !lb.SetEndpoints(svc, readyEndpoints(3)) {
				t.Fatal("first SetEndpoints reported no change")
			}
			sp := lb.ServicePort(svc)
			if ep := mustNext(t, sp, clientA, false); ep != backend(1) {
				t.Fatalf("clientA pinned to %v, want %v", ep, backend(1))
			}

			if got := lb.SetEndpoints(svc, tt.next); got != tt.wantChanged {
				t.Errorf("SetEndpoints changed = %v, want %v", got, tt.wantChanged)
			}
			if ep := mustNext(t, sp, clientB, false); ep != tt.wantNext {
				t.Errorf("new client got %v, want %v", ep, tt.wantNext)
			}
			if ep := mustNext(t, sp, clientA, false); ep != tt.wantPinA {
				t.Errorf("clientA got %v, want %v", ep, tt.wantPinA)
			}
			// Whatever happened, clientA is pinned from now on.
			if ep := mustNext(t, sp, clientA, false); ep != tt.wantPinA {
				t.Errorf("clientA moved again to %v, want to stay on %v", ep, tt.wantPinA)
			}
		})
	}
}

func TestSetEndpointsShufflesOnlyOnChange(t *testing.T) {
	lb, _ := newTestBalancer(t)
	shuffles := 0
	lb.shuffle = func(a []netip.AddrPort) {
		shuffles++
		slices.Reverse(a)
	}
	svc := svcName("shuffle")
	lb.SetEndpoints(svc, readyEndpoints(3))
	lb.SetEndpoints(svc, []Endpoint{{Addr: backend(2), Ready: true}, {Addr: backend(3), Ready: true}, {Addr: backend(1), Ready: true}})
	if shuffles != 1 {
		t.Errorf("shuffled %d times, want 1 (the reordered set is no change)", shuffles)
	}
	got := picks(t, lb.ServicePort(svc), clientA, 3)
	if want := []netip.AddrPort{backend(3), backend(2), backend(1)}; !slices.Equal(got, want) {
		t.Errorf("picks = %v, want the shuffled order %v", got, want)
	}
}

func TestDefaultShuffleKeepsMembers(t *testing.T) {
	lb := New(nil, Limits{})
	a := []netip.AddrPort{backend(1), backend(2), backend(3), backend(4)}
	lb.shuffle(a)
	if !newAddrSet(a).equalTo([]netip.AddrPort{backend(1), backend(2), backend(3), backend(4)}) {
		t.Errorf("shuffle changed the members: %v", a)
	}
}

func TestNextResetAffinity(t *testing.T) {
	tests := []struct {
		name      string
		endpoints int
		// otherPicks is how many picks another client makes between the
		// pin and the retry, moving the shared cursor.
		otherPicks int
		want       netip.AddrPort
	}{
		{name: "moves to the next endpoint", endpoints: 3, otherPicks: 0, want: backend(2)},
		{name: "skips the pinned one when the cursor is on it", endpoints: 3, otherPicks: 2, want: backend(2)},
		{name: "single endpoint: nothing else to try", endpoints: 1, otherPicks: 0, want: backend(1)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			lb, _ := newTestBalancer(t)
			svc := svcName("retry")
			lb.SetAffinity(svc, clientIPPolicy(time.Hour))
			lb.SetEndpoints(svc, readyEndpoints(tt.endpoints))
			sp := lb.ServicePort(svc)
			if ep := mustNext(t, sp, clientA, false); ep != backend(1) {
				t.Fatalf("pinned to %v, want %v", ep, backend(1))
			}
			for i := range tt.otherPicks {
				mustNext(t, sp, netip.AddrFrom4([4]byte{198, 51, 100, byte(i + 1)}), false)
			}
			if ep := mustNext(t, sp, clientA, true); ep != tt.want {
				t.Errorf("retry got %v, want %v", ep, tt.want)
			}
			// The retry re-pinned the client.
			if ep := mustNext(t, sp, clientA, false); ep != tt.want {
				t.Errorf("after retry, client went to %v, want to stay on %v", ep, tt.want)
			}
		})
	}
}

func TestNextResetAffinityWithoutPolicyIsRoundRobin(t *testing.T) {
	lb, _ := newTestBalancer(t)
	svc := svcName("retry-none")
	lb.SetEndpoints(svc, readyEndpoints(3))
	sp := lb.ServicePort(svc)
	got := []netip.AddrPort{mustNext(t, sp, clientA, false), mustNext(t, sp, clientA, true)}
	if want := []netip.AddrPort{backend(1), backend(2)}; !slices.Equal(got, want) {
		t.Errorf("picks = %v, want %v", got, want)
	}
}

// TestAffinityTimeout walks a client through timeouts: refresh from the last
// use, policy changes after entries exist, and the order in which the two
// sides (Service, EndpointSlice) arrive.
func TestAffinityTimeout(t *testing.T) {
	type step struct {
		advance   time.Duration
		setPolicy *AffinityPolicy // applied after advancing, before the access
		wantSame  bool            // the access returns the endpoint of the previous one
	}
	policy := func(p AffinityPolicy) *AffinityPolicy { return &p }
	tests := []struct {
		name           string
		endpointsFirst bool // kubernetes#107398: endpoints before the Service's affinity
		initial        AffinityPolicy
		steps          []step
	}{
		{
			name:    "timeout counts from the last use",
			initial: clientIPPolicy(3 * time.Second),
			steps: []step{
				{advance: 2 * time.Second, wantSame: true},
				{advance: 2 * time.Second, wantSame: true}, // 4 s after the first use, 2 s after the last
				{advance: 2 * time.Second, wantSame: true},
				{advance: 3 * time.Second, wantSame: false},
			},
		},
		{
			name:           "kubernetes#107398: timeout set after endpoints arrived applies",
			endpointsFirst: true,
			initial:        clientIPPolicy(3 * time.Second),
			steps: []step{
				{advance: time.Second, wantSame: true},
				{advance: 4 * time.Second, wantSame: false},
			},
		},
		{
			name:    "timeout lowered after entries exist takes effect",
			initial: clientIPPolicy(time.Hour),
			steps: []step{
				{advance: 10 * time.Second, wantSame: true},
				{advance: 5 * time.Second, setPolicy: policy(clientIPPolicy(3 * time.Second)), wantSame: false},
			},
		},
		{
			name:    "timeout raised after entries exist takes effect",
			initial: clientIPPolicy(3 * time.Second),
			steps: []step{
				{advance: 10 * time.Second, setPolicy: policy(clientIPPolicy(time.Minute)), wantSame: true},
			},
		},
		{
			name:    "zero timeout means the default 10800 s",
			initial: clientIPPolicy(0),
			steps: []step{
				{advance: DefaultAffinityTimeout - time.Second, wantSame: true},
				{advance: DefaultAffinityTimeout, wantSame: false},
			},
		},
		{
			name:    "switching to None forgets pins",
			initial: clientIPPolicy(time.Hour),
			steps: []step{
				{setPolicy: policy(AffinityPolicy{}), wantSame: false},
				{setPolicy: policy(clientIPPolicy(time.Hour)), wantSame: false},
				{wantSame: true},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			lb, clk := newTestBalancer(t)
			svc := svcName("timeout")
			if tt.endpointsFirst {
				lb.SetEndpoints(svc, readyEndpoints(3))
				lb.SetAffinity(svc, tt.initial)
			} else {
				lb.SetAffinity(svc, tt.initial)
				lb.SetEndpoints(svc, readyEndpoints(3))
			}
			sp := lb.ServicePort(svc)
			prev := mustNext(t, sp, clientA, false)
			for i, s := range tt.steps {
				clk.SetTime(clk.Now().Add(s.advance))
				if s.setPolicy != nil {
					lb.SetAffinity(svc, *s.setPolicy)
				}
				// With round robin over 3 endpoints and one client, a re-pick
				// always lands on another endpoint.
				got := mustNext(t, sp, clientA, false)
				if same := got == prev; same != s.wantSame {
					t.Errorf("step %d (+%v): got %v after %v, same = %v, want %v", i, s.advance, got, prev, same, s.wantSame)
				}
				prev = got
			}
		})
	}
}

func TestSnapshotOfServicePort(t *testing.T) {
	lb, clk := newTestBalancer(t)
	svc := svcName("snap")
	lb.SetAffinity(svc, clientIPPolicy(10*time.Second))
	lb.SetEndpoints(svc, readyEndpoints(3))
	sp := lb.ServicePort(svc)
	mustNext(t, sp, clientB, false) // backend(1), at t0
	clk.SetTime(clk.Now().Add(20 * time.Second))
	mustNext(t, sp, clientA, false) // backend(2), at t0+20s; clientB has expired

	got := sp.Snapshot()
	want := Snapshot{
		Endpoints: []netip.AddrPort{backend(3), backend(1), backend(2)}, // from the next pick on
		Affinity:  clientIPPolicy(10 * time.Second),
		Clients:   []AffinityEntry{{ClientIP: clientA, Endpoint: backend(2), LastUsed: testStart.Add(20 * time.Second)}},
	}
	if !slices.Equal(got.Endpoints, want.Endpoints) || got.Affinity != want.Affinity || !slices.Equal(got.Clients, want.Clients) {
		t.Errorf("Snapshot = %+v, want %+v", got, want)
	}
}

func TestNextTreatsIPv4MappedAsIPv4(t *testing.T) {
	lb, _ := newTestBalancer(t)
	svc := svcName("mapped")
	lb.SetAffinity(svc, clientIPPolicy(time.Hour))
	lb.SetEndpoints(svc, readyEndpoints(3))
	sp := lb.ServicePort(svc)
	plain := mustNext(t, sp, ip("192.0.2.7"), false)
	if mapped := mustNext(t, sp, ip("::ffff:192.0.2.7"), false); mapped != plain {
		t.Errorf("IPv4-mapped client got %v, the same client as IPv4 got %v", mapped, plain)
	}
}

// TestFailedRepinsOnTheNextPick: an endpoint that failed the client after
// Next returned it (a UDP session's ICMP port unreachable) is left on the
// client's next pick as a retry would leave it, and the client is re-pinned
// there; a Failed for an endpoint the client is no longer pinned to, or on a
// port without affinity, changes nothing.
func TestFailedRepinsOnTheNextPick(t *testing.T) {
	lb, _ := newTestBalancer(t)
	svc := svcName("udp-dead")
	lb.SetAffinity(svc, clientIPPolicy(time.Hour))
	lb.SetEndpoints(svc, readyEndpoints(2))
	sp := lb.ServicePort(svc)
	if ep := mustNext(t, sp, clientA, false); ep != backend(1) {
		t.Fatalf("pinned to %v, want %v", ep, backend(1))
	}
	mustNext(t, sp, clientB, false) // the cursor is back on backend(1)
	sp.Failed(clientA, backend(1))
	if ep := mustNext(t, sp, clientA, false); ep != backend(2) {
		t.Fatalf("after Failed the client went to %v, want %v", ep, backend(2))
	}
	if ep := mustNext(t, sp, clientA, false); ep != backend(2) {
		t.Fatalf("re-pinned to %v, want to stay on %v", ep, backend(2))
	}
	sp.Failed(clientA, backend(1)) // stale: pinned to backend(2) now
	if ep := mustNext(t, sp, clientA, false); ep != backend(2) {
		t.Fatalf("a stale Failed moved the client to %v", ep)
	}

	none := svcName("udp-none")
	lb.SetEndpoints(none, readyEndpoints(2))
	np := lb.ServicePort(none)
	first := mustNext(t, np, clientA, false)
	np.Failed(clientA, first)
	if ep := mustNext(t, np, clientA, false); ep == first {
		t.Fatalf("without affinity round robin still moves on, got %v twice", ep)
	}
}

// A retry moves past every endpoint the connection's attempts failed on,
// whatever other connections picked in between (the cursor is shared), and
// comes back to a tried one only when none is left; under affinity the
// client is re-pinned to what it got.
func TestRetryPastTried(t *testing.T) {
	lb, _ := newTestBalancer(t)
	name := svcName("retry")
	lb.SetEndpoints(name, readyEndpoints(3))
	sp := lb.ServicePort(name)
	dead := backend(1)
	for round := range 30 {
		// Another connection's pick lands between two attempts of this one.
		for range round % 3 {
			mustNext(t, sp, clientB, false)
		}
		if ep, err := sp.Retry(clientA, []netip.AddrPort{dead}); err != nil || ep == dead {
			t.Fatalf("round %d: retry got %v, %v; want another than %v", round, ep, err, dead)
		}
	}
	mustNext(t, sp, clientB, false)
	ep, err := sp.Retry(clientA, []netip.AddrPort{backend(1), backend(2), backend(3)})
	if next := mustNext(t, sp, clientB, false); err != nil || ep != next {
		t.Fatalf("every endpoint tried: a retry picked %v, want the one at the cursor, %v", ep, next)
	}

	lb.SetAffinity(name, clientIPPolicy(time.Hour))
	pinned := mustNext(t, sp, clientA, false)
	ep, err = sp.Retry(clientA, []netip.AddrPort{pinned})
	if err != nil || ep == pinned {
		t.Fatalf("retry under affinity: %v, %v", ep, err)
	}
	if again := mustNext(t, sp, clientA, false); again != ep {
		t.Fatalf("after the retry the client went to %v, want re-pinned to %v", again, ep)
	}
}

// Under ClientIP affinity the clients pinned to an endpoint that died are
// spread over the others as they fail on it, through Retry (a TCP dial)
// and through Failed and Next (a UDP refusal) alike: a pinned client's Next
// takes no round-robin turn, so a pick from the cursor that leaves it in
// place re-pinned every one of them to the same endpoint, for the affinity
// timeout (100 clients of a dead endpoint of 4: all 100 on one).
func TestRepinAfterFailureSpreads(t *testing.T) {
	lb, _ := newTestBalancer(t)
	name := svcName("repin-spread")
	lb.SetAffinity(name, clientIPPolicy(time.Hour))
	lb.SetEndpoints(name, readyEndpoints(4))
	sp := lb.ServicePort(name)
	dead := backend(1)
	var onDead []netip.Addr
	for i := range 400 {
		client := netip.AddrFrom4([4]byte{192, 0, byte(2 + i/250), byte(i % 250)})
		if mustNext(t, sp, client, false) == dead {
			onDead = append(onDead, client)
		}
	}
	got := map[netip.AddrPort]int{}
	for i, client := range onDead {
		ep := netip.AddrPort{}
		if i%2 == 0 {
			var err error
			if ep, err = sp.Retry(client, []netip.AddrPort{dead}); err != nil {
				t.Fatal(err)
			}
		} else {
			sp.Failed(client, dead)
			ep = mustNext(t, sp, client, false)
		}
		if ep == dead {
			t.Fatalf("client %v re-pinned to the dead endpoint", client)
		}
		got[ep]++
	}
	for _, ep := range []netip.AddrPort{backend(2), backend(3), backend(4)} {
		if n, fair := got[ep], len(onDead)/3; n < fair-1 || n > fair+1 {
			t.Errorf("the dead endpoint's %d clients were re-pinned as %v; want about %d on each other endpoint", len(onDead), got, fair)
			break
		}
	}
}

// A retry does not move the round-robin cursor: a dead endpoint beside
// live ones is the first pick of one connection in n, as without the
// failure. When the retry's pick moved the cursor, with one dead and one
// live endpoint the retry put the cursor back on the dead one and every
// new connection tried it first (a 250 ms wait each when it drops SYNs).
func TestRetryLeavesTheCursor(t *testing.T) {
	for _, n := range []int{2, 3, 5} {
		lb, _ := newTestBalancer(t)
		name := svcName("retry-cursor")
		lb.SetEndpoints(name, readyEndpoints(n))
		sp := lb.ServicePort(name)
		dead := backend(1)
		const conns = 60
		firstOnDead := 0
		for range conns {
			ep := mustNext(t, sp, clientA, false)
			if ep != dead {
				continue
			}
			firstOnDead++
			if ep, err := sp.Retry(clientA, []netip.AddrPort{dead}); err != nil || ep == dead {
				t.Fatalf("%d endpoints: retry got %v, %v; want another than %v", n, ep, err, dead)
			}
		}
		if want := conns / n; firstOnDead != want {
			t.Errorf("%d endpoints: %d of %d connections tried the dead endpoint first, want %d (1 in %d)", n, firstOnDead, conns, want, n)
		}
	}
}
