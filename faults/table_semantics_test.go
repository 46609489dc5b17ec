package faults

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/relay"
)

// origins lists a port's toxics as "name:origin" in order.
func origins(t *testing.T, tbl *Table, proxy string) string {
	t.Helper()
	info, err := tbl.Proxy(proxy)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, a := range info.Toxics {
		out = append(out, a.Name+":"+a.Origin)
	}
	return strings.Join(out, " ")
}

// The API's verbs on a table whose port declares one toxic: each step
// states the error it must give (nil for none) and the toxics listed after.
func TestTableAPISemantics(t *testing.T) {
	tbl, p := declared(t, 0, 0, "TCP", `{"name":"declared","type":"latency","attributes":{"latency":5}}`)
	udp := tbl.Port("default.dns.53", "UDP")
	web := p.Name()
	var fe *FieldError
	isField := func(field string) func(error) bool {
		return func(err error) bool { return errors.As(err, &fe) && fe.Field == field }
	}
	is := func(target error) func(error) bool { return func(err error) bool { return errors.Is(err, target) } }
	ok := func(err error) bool { return err == nil }
	add := func(proxy, js string) func() error {
		return func() error {
			var tx Toxic
			if err := tx.UnmarshalJSON([]byte(js)); err != nil {
				return err
			}
			_, err := tbl.AddToxic(proxy, tx)
			return err
		}
	}
	update := func(name, patch string) func() error {
		return func() error { _, err := tbl.UpdateToxic(web, name, []byte(patch)); return err }
	}
	remove := func(name string) func() error { return func() error { return tbl.RemoveToxic(web, name) } }

	for _, step := range []struct {
		name   string
		do     func() error
		errOK  func(error) bool
		toxics string
	}{
		{"add", add(web, `{"name":"cut","type":"reset_peer","toxicity":0.5}`), ok, "declared:annotation cut:api"},
		{"add again", add(web, `{"name":"cut","type":"reset_peer"}`), is(ErrToxicExists), "declared:annotation cut:api"},
		{"add over a declared name", add(web, `{"name":"declared","type":"timeout"}`), is(ErrToxicExists), "declared:annotation cut:api"},
		{"add to a missing proxy", add("default.nope.http", `{"type":"timeout"}`), is(ErrProxyNotFound), "declared:annotation cut:api"},
		{"add with a port", add(web, `{"type":"timeout","port":"http"}`), isField("port"), "declared:annotation cut:api"},
		{"add a UDP toxic to TCP", add(web, `{"type":"loss"}`), isField("type"), "declared:annotation cut:api"},
		{"add a TCP toxic to UDP", add(udp.Name(), `{"type":"slicer","attributes":{"average_size":10}}`), isField("type"), "declared:annotation cut:api"},
		{"add invalid", add(web, `{"type":"latency","toxicity":2}`), isField("toxicity"), "declared:annotation cut:api"},
		{"add default name", add(web, `{"type":"slow_close","attributes":{"delay":10}}`), ok, "declared:annotation cut:api slow_close_downstream:api"},
		{"update", update("cut", `{"toxicity":0.25}`), ok, "declared:annotation cut:api slow_close_downstream:api"},
		{"update bad value", update("cut", `{"toxicity":7}`), isField("toxicity"), "declared:annotation cut:api slow_close_downstream:api"},
		{"update bad body", update("cut", `{"toxicity":`), isField("body"), "declared:annotation cut:api slow_close_downstream:api"},
		{"update unknown field", update("cut", `{"latancy":1}`), isField("latancy"), "declared:annotation cut:api slow_close_downstream:api"},
		{"update wrong type", update("cut", `{"toxicity":"1"}`), isField("toxicity"), "declared:annotation cut:api slow_close_downstream:api"},
		{"update not an object", update("cut", `[1]`), isField("body"), "declared:annotation cut:api slow_close_downstream:api"},
		{"update port", update("cut", `{"port":"http"}`), isField("port"), "declared:annotation cut:api slow_close_downstream:api"},
		{"update missing", update("nope", `{"toxicity":1}`), is(ErrToxicNotFound), "declared:annotation cut:api slow_close_downstream:api"},
		{"update declared", update("declared", `{"toxicity":0}`), is(ErrDeclared), "declared:annotation cut:api slow_close_downstream:api"},
		{"remove declared", remove("declared"), is(ErrDeclared), "declared:annotation cut:api slow_close_downstream:api"},
		{"remove missing", remove("nope"), is(ErrToxicNotFound), "declared:annotation cut:api slow_close_downstream:api"},
		{"remove", remove("slow_close_downstream"), ok, "declared:annotation cut:api"},
		{"reset keeps declared", func() error { tbl.Reset(); return nil }, ok, "declared:annotation"},
	} {
		err := step.do()
		if !step.errOK(err) {
			t.Fatalf("%s: unexpected error %v", step.name, err)
		}
		if got := origins(t, tbl, web); got != step.toxics {
			t.Fatalf("%s: toxics %q, want %q", step.name, got, step.toxics)
		}
	}
}

// An update merges: attributes not given keep their value, the name and
// type cannot change, and the result is checked like a new toxic.
func TestTableUpdateMerges(t *testing.T) {
	tbl, p := declared(t, 0, 0, "TCP")
	if _, err := tbl.AddToxic(p.Name(), toxic(t, `{"name":"lat","type":"latency","toxicity":0.5,"attributes":{"latency":100,"jitter":10}}`)); err != nil {
		t.Fatal(err)
	}
	got, err := tbl.UpdateToxic(p.Name(), "lat", []byte(`{"attributes":{"jitter":20},"stream":"upstream","name":"renamed","type":"timeout"}`))
	if err != nil {
		t.Fatal(err)
	}
	if got.Name != "lat" || got.Type != "latency" || got.Stream != Upstream || got.Toxicity != 0.5 ||
		got.Attributes["latency"] != 100 || got.Attributes["jitter"] != 20 {
		t.Fatalf("updated to %+v", got)
	}
	at, err := tbl.Toxic(p.Name(), "lat")
	if err != nil || at.Origin != OriginAPI || at.Attributes["jitter"] != 20 {
		t.Fatalf("Toxic(lat) = %+v, %v", at, err)
	}
}

// What the API changes is what the next connection meets; a connection
// already accepted keeps what it drew.
func TestTableChangesApplyToNewConnections(t *testing.T) {
	tbl, p := declared(t, 0, 0, "TCP")
	if c := p.Accept(client1); c != nil {
		t.Fatal("no toxic: Accept must return nil (the splice path)")
	}
	if _, err := tbl.AddToxic(p.Name(), toxic(t, `{"name":"r","type":"refuse"}`)); err != nil {
		t.Fatal(err)
	}
	if c := p.Accept(client1); c == nil || !c.Refuse {
		t.Fatalf("after adding refuse: %+v, want refused", c)
	}
	if err := tbl.RemoveToxic(p.Name(), "r"); err != nil {
		t.Fatal(err)
	}
	if c := p.Accept(client1); c != nil {
		t.Fatalf("after removing refuse: %+v, want nil", c)
	}
	// Declared toxics are replaced by the next sync, not removed by the API.
	p.SetDeclared([]Toxic{toxic(t, `{"type":"refuse"}`)})
	if c := p.Accept(client1); c == nil || !c.Refuse {
		t.Fatal("declared refuse not applied")
	}
	p.SetDeclared(nil)
	if c := p.Accept(client1); c != nil {
		t.Fatal("declared refuse still applied after the annotation dropped it")
	}
}

// Down (the API's enabled=false) refuses new TCP connections, drops UDP
// datagrams and comes back up on SetEnabled(true) or Reset.
func TestTableDownRefusesAndDrops(t *testing.T) {
	tbl := NewTable(0, 0, nil)
	web := tbl.Port("default.web.http", "TCP")
	dns := tbl.Port("default.dns.53", "UDP")
	for _, name := range []string{web.Name(), dns.Name()} {
		if info, err := tbl.SetEnabled(name, false); err != nil || info.Enabled {
			t.Fatalf("SetEnabled(%s, false) = %+v, %v", name, info, err)
		}
	}
	if _, err := tbl.SetEnabled("default.nope.http", false); !errors.Is(err, ErrProxyNotFound) {
		t.Fatalf("SetEnabled on a missing proxy: %v", err)
	}
	if c := web.Accept(client1); c == nil || !c.Refuse {
		t.Fatal("down TCP port accepted a connection")
	}
	sent := 0
	dns.Datagrams().Send(StreamUp, session1, []byte("q"), func([]byte) { sent++ })
	if sent != 0 {
		t.Fatal("down UDP port passed a datagram")
	}
	tbl.Reset()
	if c := web.Accept(client1); c != nil {
		t.Fatal("after Reset the port is still faulted")
	}
	if dns.Datagrams() != nil {
		t.Fatal("after Reset the UDP port still has a datagram plan")
	}
}

// Setting a port down cuts its live connections with a reset, faulted or
// not, when the table tracks them (the fault API is served).
func TestTableDownCutsLiveConnections(t *testing.T) {
	for _, tc := range []struct {
		name string
		down func(tbl *Table, p *Port) error
	}{
		{"enabled false", func(tbl *Table, p *Port) error { _, err := tbl.SetEnabled(p.Name(), false); return err }},
		{"down toxic", func(tbl *Table, p *Port) error {
			_, err := tbl.AddToxic(p.Name(), toxic(t, `{"type":"down"}`))
			return err
		}},
		{"down toxic raised from toxicity 0", func(tbl *Table, p *Port) error {
			if _, err := tbl.AddToxic(p.Name(), toxic(t, `{"name":"d","type":"down","toxicity":0}`)); err != nil {
				return err
			}
			_, err := tbl.UpdateToxic(p.Name(), "d", []byte(`{"toxicity":1}`))
			return err
		}},
		{"down declared in the annotation", func(tbl *Table, p *Port) error {
			p.SetDeclared([]Toxic{toxic(t, `{"type":"down"}`)})
			return nil
		}},
		{"declared down raised from toxicity 0", func(tbl *Table, p *Port) error {
			p.SetDeclared([]Toxic{toxic(t, `{"name":"d","type":"down","toxicity":0}`)})
			p.SetDeclared([]Toxic{toxic(t, `{"name":"d","type":"down","toxicity":1}`)})
			return nil
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tbl, p := declared(t, 0, 0, "TCP")
			tbl.TrackLive = true
			type conn struct {
				client, backend *net.TCPConn
				done            chan struct{}
			}
			var conns []conn
			for range 3 {
				c, b, done := proxied(t, p, client1)
				// Each connection works before the port goes down.
				if _, err := c.Write([]byte("ping")); err != nil {
					t.Fatal(err)
				}
				buf := make([]byte, 4)
				b.SetReadDeadline(time.Now().Add(2 * time.Second))
				if _, err := io.ReadFull(b, buf); err != nil {
					t.Fatal(err)
				}
				conns = append(conns, conn{c, b, done})
			}
			if err := tc.down(tbl, p); err != nil {
				t.Fatal(err)
			}
			for i, c := range conns {
				select {
				case <-c.done:
				case <-time.After(2 * time.Second):
					t.Fatalf("connection %d still relayed after the port went down", i)
				}
				c.client.SetReadDeadline(time.Now().Add(2 * time.Second))
				if _, err := c.client.Read(make([]byte, 1)); !errors.Is(err, syscall.ECONNRESET) {
					t.Errorf("connection %d: client read %v, want ECONNRESET", i, err)
				}
			}
			if c, _, _ := proxied(t, p, client1); c != nil {
				t.Fatal("a new connection was relayed while the port is down")
			}
		})
	}
}

// liveConnections opens n live connections from client1 on a port of a
// table that tracks them (seed 3, no cap); each done closes when its relay
// ends.
func liveConnections(t *testing.T, n int) (*Table, *Port, []chan struct{}) {
	t.Helper()
	tbl, p := declared(t, 3, 0, "TCP")
	tbl.TrackLive = true
	var dones []chan struct{}
	for range n {
		_, _, done := proxied(t, p, client1)
		dones = append(dones, done)
	}
	return tbl, p, dones
}

// A down toxic with toxicity cuts exactly the live connections a new
// connection with the same sequence number would have refused.
func TestTableDownToxicCutsItsShare(t *testing.T) {
	const n = 20
	tbl, p, dones := liveConnections(t, n)
	if _, err := tbl.AddToxic(p.Name(), toxic(t, `{"name":"half","type":"down","toxicity":0.5}`)); err != nil {
		t.Fatal(err)
	}
	s := p.snap.Load()
	cut := 0
	// Those drawn are cut at once; then, once they are, the others must
	// still be live.
	for seq, done := range dones {
		if !s.downDraws(uint64(seq), client1) {
			continue
		}
		cut++
		select {
		case <-done:
		case <-time.After(2 * time.Second):
			t.Errorf("connection %d drew down but was not cut", seq)
		}
	}
	time.Sleep(50 * time.Millisecond)
	for seq, done := range dones {
		if s.downDraws(uint64(seq), client1) {
			continue
		}
		select {
		case <-done:
			t.Errorf("connection %d did not draw down but was cut", seq)
		default:
		}
	}
	if cut == 0 || cut == n {
		t.Fatalf("toxicity 0.5 drew %d of %d live connections", cut, n)
	}
}

// A down toxic counts in faults_injected_total each live connection it
// cuts, when added and when an update widens its draw, as it counts each
// connection it refuses at accept (and as a UDP down counts each delayed
// datagram it drops): live ones it cut went uncounted.
func TestDownCountsTheLiveConnectionsItCuts(t *testing.T) {
	const n = 20
	tbl, p, dones := liveConnections(t, n)
	injected := func() int {
		return int(testutil.ToFloat64(tbl.metrics.Injected.WithLabelValues(p.metricLabel(), "d", "down", Downstream)))
	}
	if _, err := tbl.AddToxic(p.Name(), toxic(t, `{"name":"d","type":"down","toxicity":0.5}`)); err != nil {
		t.Fatal(err)
	}
	s := p.snap.Load()
	drawn := 0
	for seq := range dones {
		if s.downDraws(uint64(seq), client1) {
			drawn++
		}
	}
	if got := injected(); got != drawn {
		t.Errorf("down at toxicity 0.5 cut %d live connections and counted %d", drawn, got)
	}
	if _, err := tbl.UpdateToxic(p.Name(), "d", []byte(`{"toxicity":1}`)); err != nil {
		t.Fatal(err)
	}
	for seq, done := range dones {
		select {
		case <-done:
		case <-time.After(2 * time.Second):
			t.Fatalf("connection %d still relayed under down at toxicity 1", seq)
		}
	}
	if got := injected(); got != n {
		t.Errorf("down raised to toxicity 1 has cut all %d live connections and counted %d", n, got)
	}
	if c, _, _ := proxied(t, p, client1); c != nil {
		t.Fatal("a new connection was relayed under down")
	}
	if got := injected(); got != n+1 {
		t.Errorf("a refused new connection: counted %d, want %d", got, n+1)
	}
}

// A down the annotation declares cuts its share of the live connections
// once, as one added through the API: declared again unchanged beside
// another toxic (a sync, an edit of another toxic) it cuts none of those
// it left, and the count of what it cut is the share it drew.
func TestDeclaredDownCutsItsShareOnce(t *testing.T) {
	const n = 20
	tbl, p := declared(t, 3, 0, "TCP")
	tbl.TrackLive = true
	type conn struct {
		client, backend *net.TCPConn
		done            chan struct{}
	}
	var conns []conn
	for range n {
		c, b, done := proxied(t, p, client1)
		conns = append(conns, conn{c, b, done})
	}
	half := `{"name":"half","type":"down","toxicity":0.5}`
	p.SetDeclared([]Toxic{toxic(t, half)})
	s := p.snap.Load()
	drawn := 0
	for seq, c := range conns {
		if !s.downDraws(uint64(seq), client1) {
			continue
		}
		drawn++
		select {
		case <-c.done:
		case <-time.After(2 * time.Second):
			t.Fatalf("connection %d drew the declared down but was not cut", seq)
		}
	}
	p.SetDeclared([]Toxic{toxic(t, half), toxic(t, `{"name":"slow","type":"latency","attributes":{"latency":1}}`)})
	// Those it did not draw still relay.
	for seq, c := range conns {
		if s.downDraws(uint64(seq), client1) {
			continue
		}
		if _, err := c.client.Write([]byte("ping")); err != nil {
			t.Fatalf("connection %d: %v", seq, err)
		}
		c.backend.SetReadDeadline(time.Now().Add(2 * time.Second))
		if _, err := io.ReadFull(c.backend, make([]byte, 4)); err != nil {
			t.Errorf("connection %d did not draw the declared down but relays no more: %v", seq, err)
		}
	}
	if got := int(testutil.ToFloat64(tbl.metrics.Injected.WithLabelValues(p.metricLabel(), "half", "down", Downstream))); got != drawn || drawn == 0 || drawn == n {
		t.Errorf("the declared down drew %d of %d live connections and counted %d", drawn, n, got)
	}
}

// Without the fault API (TrackLive off) a down the annotation declares
// cuts the faulted live connections it draws, which the port tracks, and
// returns itself for the caller to cut those that drew no fault, which
// only the proxier's registry holds; with the API the port tracks and cuts
// them all, and returns nothing to cut. Before, a faulted connection was
// not tracked without the API, and the declared down left it relaying.
func TestDeclaredDownWithoutTheFaultAPI(t *testing.T) {
	slow := `{"name":"slow","type":"latency","attributes":{"latency":1}}`
	down := `{"name":"d","type":"down"}`
	tbl, p := declared(t, 0, 0, "TCP", slow)
	c, _, done := proxied(t, p, client1)
	cut := p.SetDeclared([]Toxic{toxic(t, slow), toxic(t, down)})
	select {
	case <-done:
	case <-time.After(2 * time.Second):
		t.Fatal("a faulted connection still relayed after the declared down")
	}
	c.SetReadDeadline(time.Now().Add(2 * time.Second))
	if _, err := c.Read(make([]byte, 1)); !errors.Is(err, syscall.ECONNRESET) {
		t.Errorf("client read %v, want ECONNRESET", err)
	}
	if got := testutil.ToFloat64(tbl.metrics.Injected.WithLabelValues(p.metricLabel(), "d", "down", Downstream)); got != 1 {
		t.Errorf("the down counted %v cut connections, want 1", got)
	}
	if len(cut) != 1 || !cut[0].Draws(p, 7, client1) {
		t.Errorf("SetDeclared returned %v to cut, want the down", cut)
	}
	if again := p.SetDeclared([]Toxic{toxic(t, down)}); again != nil {
		t.Errorf("the down declared again unchanged returned %v to cut again", again)
	}
	api, q := declared(t, 0, 0, "TCP")
	api.TrackLive = true
	if cut := q.SetDeclared([]Toxic{toxic(t, down)}); cut != nil {
		t.Errorf("with the fault API SetDeclared returned %v to cut; the port cuts them all", cut)
	}
}

// --fault-max-active caps faulted live connections per port: beyond it a
// connection goes unfaulted (and is counted as skipped); a slot comes back
// when a faulted connection ends. Refused connections hold no slot.
func TestTableMaxActive(t *testing.T) {
	m := NewMetrics(nil)
	tbl := NewTable(0, 2, m)
	p := tbl.Port("default.web.http", "TCP")
	p.SetDeclared([]Toxic{toxic(t, `{"type":"latency","attributes":{"latency":1}}`)})
	a, b := p.Accept(client1), p.Accept(client1)
	if a == nil || b == nil {
		t.Fatal("the first two connections were not faulted")
	}
	if c := p.Accept(client1); c != nil {
		t.Fatal("a third faulted connection with --fault-max-active 2")
	}
	if got := float64(m.ports.lookup(p.Name()).skipped.n.Load()); got != 1 {
		t.Fatalf("skipped = %v, want 1", got)
	}
	if got := float64(m.ports.lookup(p.Name()).faulted.n.Load()); got != 2 {
		t.Fatalf("faulted live = %v, want 2", got)
	}
	a.Done()
	if c := p.Accept(client1); c == nil {
		t.Fatal("no slot came back when a faulted connection ended")
	} else {
		c.Done()
	}
	b.Done()
	if got := float64(m.ports.lookup(p.Name()).faulted.n.Load()); got != 0 {
		t.Fatalf("faulted live = %v after every connection ended, want 0", got)
	}

	// Refusals are over at once and take no slot.
	p.SetDeclared([]Toxic{toxic(t, `{"type":"refuse"}`)})
	for i := range 5 {
		c := p.Accept(client1)
		if c == nil || !c.Refuse {
			t.Fatalf("connection %d not refused", i)
		}
		c.Done()
	}
	if n := p.active.Load(); n != 0 {
		t.Fatalf("%d slots held after refusals", n)
	}
}

// With --fault-max-active reached, down and refuse still apply: a refused
// connection holds no slot, so the cap has nothing to protect from it,
// while letting it through unfaulted would keep a down port up. Their
// toxicity and clients still decide.
func TestTableMaxActiveFullStillRefuses(t *testing.T) {
	for _, refusing := range []string{
		`{"name":"r","type":"down"}`,
		`{"name":"r","type":"refuse"}`,
	} {
		t.Run(refusing, func(t *testing.T) {
			m := NewMetrics(nil)
			tbl := NewTable(0, 1, m)
			p := tbl.Port("default.web.http", "TCP")
			p.SetDeclared([]Toxic{toxic(t, `{"name":"slow","type":"latency","attributes":{"latency":1}}`)})
			holder := p.Accept(client1)
			if holder == nil || holder.Refuse {
				t.Fatal("the first connection did not take the slot")
			}
			defer holder.Done()
			p.SetDeclared([]Toxic{
				toxic(t, `{"name":"slow","type":"latency","attributes":{"latency":1}}`),
				toxic(t, refusing),
			})
			for i := range 3 {
				c := p.Accept(client1)
				if c == nil || !c.Refuse {
					t.Fatalf("connection %d with the cap reached: %+v, want refused", i, c)
				}
				c.Done()
			}
			if n := p.active.Load(); n != 1 {
				t.Fatalf("%d slots held, want the first connection's 1", n)
			}
			if got := m.ports.lookup(p.Name()).skipped.n.Load(); got != 0 {
				t.Fatalf("skipped = %v for refused connections, want 0", got)
			}
			// A refusal narrowed to other clients leaves this one to the
			// capped latency: no fault, counted as skipped.
			p.SetDeclared([]Toxic{
				toxic(t, `{"name":"slow","type":"latency","attributes":{"latency":1}}`),
				toxic(t, `{"name":"elsewhere","type":"refuse","clients":["192.0.2.0/24"]}`),
			})
			if c := p.Accept(client1); c != nil {
				t.Fatalf("a client outside the refuse toxic's CIDR: %+v, want no fault", c)
			}
			if c := p.Accept(mustAddr("192.0.2.1")); c == nil || !c.Refuse {
				t.Fatalf("a client in the refuse toxic's CIDR: %+v, want refused", c)
			}
			p.SetDeclared([]Toxic{
				toxic(t, `{"name":"slow","type":"latency","attributes":{"latency":1}}`),
				toxic(t, `{"name":"r","type":"down","toxicity":0}`),
			})
			if c := p.Accept(client1); c != nil {
				t.Fatalf("a down toxic of toxicity 0 with the cap reached: %+v, want no fault", c)
			}
		})
	}
}

// Connections accepted at once never exceed the cap.
func TestTableMaxActiveConcurrent(t *testing.T) {
	const limit = 5
	_, p := declared(t, 0, limit, "TCP", `{"type":"latency","attributes":{"latency":1}}`)
	got := make(chan *Conn, 200)
	start := make(chan struct{})
	for range 200 {
		go func() { <-start; got <- p.Accept(client1) }()
	}
	close(start)
	faulted := 0
	for range 200 {
		if c := <-got; c != nil {
			faulted++
		}
	}
	if faulted != limit {
		t.Fatalf("%d connections faulted at once, want the cap %d", faulted, limit)
	}
}

// The injected counter counts toxics per connection, and RemovePort
// forgets the port's series.
func TestTableMetrics(t *testing.T) {
	m := NewMetrics(nil)
	tbl := NewTable(0, 0, m)
	p := tbl.Port("default.web.http", "TCP")
	p.SetLabel("default/web:http")
	p.SetDeclared([]Toxic{toxic(t, `{"name":"slow","type":"latency","toxicity":0.5,"attributes":{"latency":1}}`)})
	n := 0
	for _, f := range faultedSet(p, 100, client1) {
		if f {
			n++
		}
	}
	if got := testutil.ToFloat64(m.Injected.WithLabelValues("default/web:http", "slow", "latency", Downstream)); int(got) != n {
		t.Fatalf("injected = %v, want %d", got, n)
	}
	tbl.RemovePort(p.Name())
	if c := testutil.CollectAndCount(m.Injected); c != 0 {
		t.Fatalf("%d injected series left after RemovePort", c)
	}
	if _, err := tbl.Proxy(p.Name()); !errors.Is(err, ErrProxyNotFound) {
		t.Fatalf("removed port still listed: %v", err)
	}
}

// A connection accepted before the port went down but attached after it
// (while its backend was being dialled) is cut at Attach: the cut of live
// connections could not see it yet.
func TestTableDownBetweenAcceptAndAttach(t *testing.T) {
	for _, tc := range []struct {
		name string
		down func(tbl *Table, p *Port) error
	}{
		{"enabled false", func(tbl *Table, p *Port) error { _, err := tbl.SetEnabled(p.Name(), false); return err }},
		{"down toxic", func(tbl *Table, p *Port) error {
			_, err := tbl.AddToxic(p.Name(), toxic(t, `{"type":"down"}`))
			return err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tbl, p := declared(t, 0, 0, "TCP")
			tbl.TrackLive = true
			fc := p.Accept(client1)
			if fc == nil || fc.Refuse {
				t.Fatalf("Accept with TrackLive: %+v", fc)
			}
			if err := tc.down(tbl, p); err != nil {
				t.Fatal(err)
			}
			client, proxyClient := tcpPair(t)
			proxyBackend, _ := tcpPair(t)
			fc.Attach(proxyClient, proxyBackend)
			defer fc.Done()
			client.SetReadDeadline(time.Now().Add(2 * time.Second))
			if _, err := client.Read(make([]byte, 1)); !errors.Is(err, syscall.ECONNRESET) {
				t.Fatalf("client read %v, want ECONNRESET", err)
			}
		})
	}
}

// An annotation that comes to declare the name of an API toxic takes the
// name: the API toxic gives way, so the name is one toxic again (before,
// both were listed, GET found the declared one and DELETE the API one).
func TestDeclaredNameTakesOverAPIToxic(t *testing.T) {
	tbl, p := declared(t, 0, 0, "TCP")
	for _, js := range []string{
		`{"name":"slow","type":"latency","attributes":{"latency":10}}`,
		`{"name":"other","type":"latency","attributes":{"latency":1}}`,
	} {
		if _, err := tbl.AddToxic(p.Name(), toxic(t, js)); err != nil {
			t.Fatal(err)
		}
	}
	p.SetDeclared([]Toxic{toxic(t, `{"name":"slow","type":"latency","attributes":{"latency":500}}`)})
	if got := origins(t, tbl, p.Name()); got != "slow:annotation other:api" {
		t.Fatalf("toxics: %q, want %q", got, "slow:annotation other:api")
	}
	got, err := tbl.Toxic(p.Name(), "slow")
	if err != nil || got.Attributes["latency"] != 500 {
		t.Fatalf("GET slow: %+v, %v; want the declared one (500 ms)", got, err)
	}
	if err := tbl.RemoveToxic(p.Name(), "slow"); !errors.Is(err, ErrDeclared) {
		t.Fatalf("DELETE slow: %v, want ErrDeclared", err)
	}
}

// An update of a down toxic that leaves its draw alone (toxicity, clients,
// seed) cuts nothing: a live connection stays up through an update of its
// stream. (The connections it draws are gone: cut when it came, refused at
// accept, with --fault-max-active full too.)
func TestTableDownUpdateKeepsItsDraw(t *testing.T) {
	tbl, p := declared(t, 0, 1, "TCP", `{"name":"slow","type":"latency","attributes":{"latency":0}}`)
	tbl.TrackLive = true
	clientB := mustAddr("10.0.0.2")
	c, b, done := proxied(t, p, client1) // faulted: the cap is full
	if c == nil {
		t.Fatal("the first connection was refused")
	}
	if _, err := tbl.AddToxic(p.Name(), toxic(t, `{"name":"d","type":"down","clients":["10.0.0.2/32"]}`)); err != nil {
		t.Fatal(err)
	}
	if c, _, _ := proxied(t, p, clientB); c != nil {
		t.Fatal("the down toxic let a connection through past the full fault cap")
	}
	if _, err := tbl.UpdateToxic(p.Name(), "d", []byte(`{"stream":"upstream"}`)); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
		t.Fatal("an update that changed no draw cut a live connection")
	case <-time.After(200 * time.Millisecond):
	}
	if _, err := c.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	b.SetReadDeadline(time.Now().Add(2 * time.Second))
	if _, err := io.ReadFull(b, make([]byte, 4)); err != nil {
		t.Fatal(err)
	}
}

// An update of a down toxic cuts live connections again only when it
// changes which it draws: inside its clients, those it did not draw stay up
// through a stream-only update, and go once its toxicity takes them too.
// (TestTableDownUpdateKeepsItsDraw's live connection is outside the
// toxic's clients, so it stays up whatever the update does.)
func TestTableDownUpdateCutsOnlyWhenItsDrawChanges(t *testing.T) {
	const n = 20
	tbl, p, dones := liveConnections(t, n)
	if _, err := tbl.AddToxic(p.Name(), toxic(t, `{"name":"half","type":"down","toxicity":0.5,"clients":["10.0.0.0/24"]}`)); err != nil {
		t.Fatal(err)
	}
	s := p.snap.Load()
	var kept []chan struct{}
	for seq, done := range dones {
		if !s.downDraws(uint64(seq), client1) {
			kept = append(kept, done)
			continue
		}
		select {
		case <-done:
		case <-time.After(2 * time.Second):
			t.Fatalf("connection %d drew down but was not cut", seq)
		}
	}
	if len(kept) == 0 || len(kept) == n {
		t.Fatalf("toxicity 0.5 kept %d of %d live connections", len(kept), n)
	}
	stillUp := func(what string) {
		t.Helper()
		time.Sleep(100 * time.Millisecond)
		for i, done := range kept {
			select {
			case <-done:
				t.Fatalf("%s cut live connection %d of %d that the toxic did not draw", what, i, len(kept))
			default:
			}
		}
	}
	stillUp("adding the toxic")
	if _, err := tbl.UpdateToxic(p.Name(), "half", []byte(`{"stream":"upstream"}`)); err != nil {
		t.Fatal(err)
	}
	stillUp("a stream-only update")
	if _, err := tbl.UpdateToxic(p.Name(), "half", []byte(`{"toxicity":1}`)); err != nil {
		t.Fatal(err)
	}
	for i, done := range kept {
		select {
		case <-done:
		case <-time.After(2 * time.Second):
			t.Fatalf("toxicity 1 left live connection %d of %d up", i, len(kept))
		}
	}
}

func TestDownDrawChanged(t *testing.T) {
	one, two, alsoOne := int64(1), int64(2), int64(1)
	base := Toxic{Type: "down", Toxicity: 1, Clients: []string{"10.0.0.0/8"}, Seed: &one}
	with := func(f func(*Toxic)) Toxic { tx := base; f(&tx); return tx }
	for _, tc := range []struct {
		name string
		next Toxic
		want bool
	}{
		{"nothing", base, false},
		{"stream only", with(func(tx *Toxic) { tx.Stream = Upstream }), false},
		{"same seed, another pointer", with(func(tx *Toxic) { tx.Seed = &alsoOne }), false},
		{"toxicity", with(func(tx *Toxic) { tx.Toxicity = 0.5 }), true},
		{"clients", with(func(tx *Toxic) { tx.Clients = nil }), true},
		{"seed", with(func(tx *Toxic) { tx.Seed = &two }), true},
		{"seed removed", with(func(tx *Toxic) { tx.Seed = nil }), true},
	} {
		if got := downDrawChanged(base, tc.next); got != tc.want {
			t.Errorf("%s: downDrawChanged = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// An update of a loss toxic may move it to the other model by giving that
// model's attributes alone.
func TestTableUpdateSwitchesLossModel(t *testing.T) {
	for _, tc := range []struct {
		name, add, patch string
		want             map[string]float64 // attributes after; nil: refused
		wantErrField     string
	}{
		{"random to Gilbert-Elliott", `{"attributes":{"rate":0.1}}`, `{"attributes":{"p":0.1}}`,
			map[string]float64{"p": 0.1, "r": 1, "loss_bad": 1, "loss_good": 0}, ""},
		{"Gilbert-Elliott to random", `{"attributes":{"p":0.05,"r":0.5}}`, `{"attributes":{"rate":0.2}}`,
			map[string]float64{"rate": 0.2, "p": 0}, ""},
		{"Gilbert-Elliott p 0 alone", `{"attributes":{"p":0.05,"r":0.5}}`, `{"attributes":{"p":0}}`, nil, "attributes.p"},
		{"Gilbert-Elliott p 0 with rate", `{"attributes":{"p":0.05,"r":0.5}}`, `{"attributes":{"p":0,"rate":0}}`,
			map[string]float64{"rate": 0, "p": 0}, ""},
		{"both models at once", `{"attributes":{"rate":0.1}}`, `{"attributes":{"p":0.1,"rate":0.2}}`, nil, "attributes.rate"},
		{"Gilbert-Elliott stays", `{"attributes":{"p":0.05,"r":0.5}}`, `{"attributes":{"r":0.25}}`,
			map[string]float64{"p": 0.05, "r": 0.25}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tbl, p := declared(t, 0, 0, "UDP")
			add := strings.Replace(tc.add, "{", `{"name":"l","type":"loss",`, 1)
			if _, err := tbl.AddToxic(p.Name(), toxic(t, add)); err != nil {
				t.Fatal(err)
			}
			got, err := tbl.UpdateToxic(p.Name(), "l", []byte(tc.patch))
			if tc.want == nil {
				var fe *FieldError
				if !errors.As(err, &fe) || fe.Field != tc.wantErrField {
					t.Fatalf("update = %+v, %v; want refused on %s", got, err, tc.wantErrField)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			for k, v := range tc.want {
				if got.Attributes[k] != v {
					t.Errorf("attributes %v, want %s = %v", got.Attributes, k, v)
				}
			}
			if _, ok := got.Attributes["rate"]; ok && tc.want["p"] > 0 {
				t.Errorf("attributes %v: a Gilbert-Elliott toxic shows no rate", got.Attributes)
			}
		})
	}
}

// OnEnabled tells a watcher the port's state: at once when it is down,
// then each change once, in order, /reset included, and an enable (or
// /reset) of a port already up again (a socket that could not listen
// tries again and answers why not); stop ends it.
func TestPortOnEnabled(t *testing.T) {
	tbl := NewTable(0, 0, nil)
	web := tbl.Port("default.web.http", "TCP")
	var got []bool
	stop := web.OnEnabled(func(enabled bool) error { got = append(got, enabled); return nil })
	if len(got) != 0 {
		t.Fatalf("an up port told %v at registration, want nothing", got)
	}
	for _, enabled := range []bool{false, false, true, false} {
		if _, err := tbl.SetEnabled(web.Name(), enabled); err != nil {
			t.Fatal(err)
		}
	}
	_ = tbl.Reset()
	_ = tbl.Reset()
	if want := "[false true false true true]"; fmt.Sprint(got) != want {
		t.Fatalf("told %v, want %s (each change once, and the enable of an up port)", got, want)
	}
	if _, err := tbl.SetEnabled(web.Name(), false); err != nil {
		t.Fatal(err)
	}
	var late []bool
	stopLate := web.OnEnabled(func(enabled bool) error { late = append(late, enabled); return nil })
	defer stopLate()
	if fmt.Sprint(late) != "[false]" {
		t.Fatalf("a watcher of a down port was told %v, want [false] at once", late)
	}
	stop()
	got = nil
	if _, err := tbl.SetEnabled(web.Name(), true); err != nil {
		t.Fatal(err)
	}
	if len(got) != 0 {
		t.Fatalf("told %v after stop", got)
	}
}

// Removing a timeout toxic through the API (or /reset) ends the live
// connections it holds, with a FIN, as Toxiproxy's TimeoutToxic.Cleanup
// closes its stub (its TestTimeoutToxicClosesConnectionOnRemove): the
// pattern "hang the connection with timeout 0, remove the toxic, the
// client sees EOF and reconnects". Kept with the toxics it drew, such a
// connection was held for ever. A connection that did not draw it stays.
func TestRemovedTimeoutToxicEndsTheConnectionsItHolds(t *testing.T) {
	for _, remove := range []string{"delete", "reset"} {
		t.Run(remove, func(t *testing.T) {
			tbl, p := declared(t, 3, 0, "TCP")
			tbl.TrackLive = true
			if _, err := tbl.AddToxic(p.Name(), toxic(t, `{"name":"hang","type":"timeout","attributes":{"timeout":0}}`)); err != nil {
				t.Fatal(err)
			}
			held, backend, done := proxied(t, p, client1)
			if _, err := backend.Write([]byte("dropped")); err != nil {
				t.Fatal(err)
			}
			if remove == "delete" {
				if err := tbl.RemoveToxic(p.Name(), "hang"); err != nil {
					t.Fatal(err)
				}
			} else {
				tbl.Reset()
			}
			held.SetReadDeadline(time.Now().Add(3 * time.Second))
			n, err := io.Copy(io.Discard, held)
			if err != nil || n != 0 {
				t.Fatalf("held connection read %d bytes, then %v; want its FIN once the toxic was removed", n, err)
			}
			select {
			case <-done:
			case <-time.After(3 * time.Second):
				t.Fatal("the relay did not end")
			}
			// A new connection has no toxic, and is not ended.
			client, backend2, done2 := proxied(t, p, client1)
			if _, err := backend2.Write([]byte("ok")); err != nil {
				t.Fatal(err)
			}
			client.SetReadDeadline(time.Now().Add(3 * time.Second))
			if _, err := io.ReadFull(client, make([]byte, 2)); err != nil {
				t.Fatalf("a connection after the removal: %v", err)
			}
			client.Close()
			backend2.Close()
			<-done2
		})
	}
}

// A timeout toxic that leaves the Service's annotation ends the live
// connections it holds, as one removed through the API does: removed, or
// no longer that timeout (another type, the other stream), or an API
// timeout whose name the annotation comes to declare (it gives way). Kept,
// a connection held by timeout 0 hung until its client gave up, and
// stayed counted as faulted. An annotation that only changes the
// timeout's attributes updates it, which reaches new connections only (as
// an API update). Without the fault API (live connections not tracked
// for it) the annotation's removal still reaches them.
func TestDeclaredTimeoutLeavingEndsTheConnectionsItHolds(t *testing.T) {
	const hold = `{"name":"hold","type":"timeout","attributes":{"timeout":0}}`
	for _, tc := range []struct {
		name     string
		declared string // the annotation's toxic before ("" = none)
		api      string // an API toxic before ("" = none)
		after    string // the annotation's toxic after ("" = none)
		ends     bool
	}{
		{"removed", hold, "", "", true},
		{"type changed", hold, "", `{"name":"hold","type":"latency","attributes":{"latency":10}}`, true},
		{"stream changed", hold, "", `{"name":"hold","type":"timeout","stream":"upstream","attributes":{"timeout":0}}`, true},
		{"API toxic gives way", "", hold, `{"name":"hold","type":"latency","attributes":{"latency":10}}`, true},
		{"attributes changed", hold, "", `{"name":"hold","type":"timeout","attributes":{"timeout":60000}}`, false},
		{"another toxic removed", `{"name":"other","type":"latency","attributes":{"latency":1}}`, hold, "", false},
	} {
		for _, track := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/tracked=%v", tc.name, track), func(t *testing.T) {
				var before []string
				if tc.declared != "" {
					before = append(before, tc.declared)
				}
				tbl, p := declared(t, 0, 0, "TCP", before...)
				tbl.TrackLive = track
				if tc.api != "" {
					if _, err := tbl.AddToxic(p.Name(), toxic(t, tc.api)); err != nil {
						t.Fatal(err)
					}
				}
				held, backend, done := proxied(t, p, client1)
				if _, err := backend.Write([]byte("dropped")); err != nil {
					t.Fatal(err)
				}
				var after []Toxic
				if tc.after != "" {
					after = append(after, toxic(t, tc.after))
				}
				p.SetDeclared(after)
				if !tc.ends {
					held.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
					if n, err := held.Read(make([]byte, 64)); !errors.Is(err, os.ErrDeadlineExceeded) {
						t.Fatalf("held connection read %d bytes, %v; want it still held", n, err)
					}
					held.Close()
					backend.Close()
					relayEnds(t, done)
					return
				}
				held.SetReadDeadline(time.Now().Add(3 * time.Second))
				n, err := io.Copy(io.Discard, held)
				if err != nil || n != 0 {
					t.Fatalf("held connection read %d bytes, then %v; want its FIN once the annotation no longer declares the timeout", n, err)
				}
				relayEnds(t, done)
			})
		}
	}
}

// A connection accepted while a timeout toxic was in force, and attached
// (its backend dialled) after the toxic was removed, is ended too: the
// removal's look at the live connections did not see it yet.
func TestTimeoutRemovedBeforeAttachEndsTheConnection(t *testing.T) {
	const hold = `{"name":"hold","type":"timeout","attributes":{"timeout":0}}`
	for _, via := range []string{"annotation", "api"} {
		t.Run(via, func(t *testing.T) {
			tbl, p := declared(t, 0, 0, "TCP")
			tbl.TrackLive = true
			if via == "annotation" {
				p.SetDeclared([]Toxic{toxic(t, hold)})
			} else if _, err := tbl.AddToxic(p.Name(), toxic(t, hold)); err != nil {
				t.Fatal(err)
			}
			remove := func(_, _ *net.TCPConn) {
				if via == "annotation" {
					p.SetDeclared(nil)
				} else if err := tbl.RemoveToxic(p.Name(), "hold"); err != nil {
					t.Fatal(err)
				}
			}
			held, _, done := proxiedWith(t, p, client1, relay.Options{}, remove)
			held.SetReadDeadline(time.Now().Add(3 * time.Second))
			if n, err := io.Copy(io.Discard, held); err != nil || n != 0 {
				t.Fatalf("held connection read %d bytes, then %v; want its FIN", n, err)
			}
			relayEnds(t, done)
		})
	}
}

// An API update that moves a timeout toxic to the other stream takes it
// off the stream whose connections it holds: they end, as when the
// annotation moves one (an update of its attributes reaches new
// connections only).
func TestAPITimeoutMovedToTheOtherStreamEndsTheConnectionsItHolds(t *testing.T) {
	for _, tc := range []struct {
		patch string
		ends  bool
	}{
		{`{"stream":"upstream"}`, true},
		{`{"attributes":{"timeout":60000}}`, false},
	} {
		t.Run(tc.patch, func(t *testing.T) {
			tbl, p := declared(t, 0, 0, "TCP")
			tbl.TrackLive = true
			if _, err := tbl.AddToxic(p.Name(), toxic(t, `{"name":"hold","type":"timeout","attributes":{"timeout":0}}`)); err != nil {
				t.Fatal(err)
			}
			held, backend, done := proxied(t, p, client1)
			if _, err := tbl.UpdateToxic(p.Name(), "hold", []byte(tc.patch)); err != nil {
				t.Fatal(err)
			}
			if !tc.ends {
				held.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
				if n, err := held.Read(make([]byte, 64)); !errors.Is(err, os.ErrDeadlineExceeded) {
					t.Fatalf("held connection read %d bytes, %v; want it still held", n, err)
				}
				held.Close()
				backend.Close()
				relayEnds(t, done)
				return
			}
			held.SetReadDeadline(time.Now().Add(3 * time.Second))
			if n, err := io.Copy(io.Discard, held); err != nil || n != 0 {
				t.Fatalf("held connection read %d bytes, then %v; want its FIN", n, err)
			}
			relayEnds(t, done)
		})
	}
}

// A connection accepted before a down came and attached after the down's
// cut walked the live ones (its backend was being dialled) is cut as it
// attaches, and counted, as the cut counts those it finds.
func TestDownSinceAcceptCutsAtAttach(t *testing.T) {
	tbl, p := declared(t, 0, 0, "TCP")
	tbl.TrackLive = true
	c := p.Accept(client1)
	if c == nil || c.Faulted() || c.Refuse {
		t.Fatalf("accepted with no toxic: %+v, want a tracked fault-free connection", c)
	}
	if _, err := tbl.AddToxic(p.Name(), toxic(t, `{"name":"d","type":"down"}`)); err != nil {
		t.Fatal(err)
	}
	resets := 0
	c.AttachReset(func() { resets++ })
	if resets != 1 {
		t.Errorf("attached after the down came: reset %d times, want 1", resets)
	}
	if got := testutil.ToFloat64(tbl.metrics.Injected.WithLabelValues(p.metricLabel(), "d", "down", Downstream)); got != 1 {
		t.Errorf("the down counted %v connections cut, want 1", got)
	}
	c.Done()
}
