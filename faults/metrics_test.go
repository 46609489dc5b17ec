package faults

import (
	"fmt"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// A port's faulted_connections, faults_skipped_max_active_total and
// faults_delay_queue_dropped_total exist from its first fault (a toxic, or
// disabled through the API), at zero, follow its label (the proxier's name
// replaces the API's), count what its connections do, stay once its faults
// are removed and go with the port. A port that never had a fault has none:
// every service port had three zero series, 42,000 of the 164,000 on
// /metrics at 10,000 Services (sweep 12).
func TestPortSeriesExposition(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	tbl := NewTable(0, 1, NewMetrics(reg))
	names := []string{"kubeproxy_userspace_faulted_connections", "kubeproxy_userspace_faults_skipped_max_active_total", "kubeproxy_userspace_faults_delay_queue_dropped_total"}
	expect := func(t *testing.T, want string) {
		t.Helper()
		if err := testutil.GatherAndCompare(reg, strings.NewReader(want), names...); err != nil {
			t.Fatal(err)
		}
	}
	const head = `
# HELP kubeproxy_userspace_faulted_connections Live TCP connections with at least one toxic applied
# TYPE kubeproxy_userspace_faulted_connections gauge
`
	const skippedHead = `# HELP kubeproxy_userspace_faults_skipped_max_active_total Connections left unfaulted because --fault-max-active faulted connections were live
# TYPE kubeproxy_userspace_faults_skipped_max_active_total counter
`
	const droppedHead = `# HELP kubeproxy_userspace_faults_delay_queue_dropped_total UDP datagrams dropped because the service port's queue of delayed datagrams (one per direction, 10,000 datagrams or 16 MiB), or a reorder toxic's held ones (as many), was full, or faults held --fault-max-buffered-bytes
# TYPE kubeproxy_userspace_faults_delay_queue_dropped_total counter
`
	p := tbl.Port("default.web.http", "TCP")
	idle := tbl.Port("default.dns.dns", "UDP")
	p.SetLabel("default/web:http")
	expect(t, "")

	p.SetDeclared([]Toxic{toxic(t, `{"type":"latency","attributes":{"latency":1}}`)})
	expect(t, head+`kubeproxy_userspace_faulted_connections{service_port="default/web:http"} 0
`+skippedHead+`kubeproxy_userspace_faults_skipped_max_active_total{service_port="default/web:http"} 0
`+droppedHead+`kubeproxy_userspace_faults_delay_queue_dropped_total{service_port="default/web:http"} 0
`)
	a := p.Accept(client1)
	if a == nil || p.Accept(client1) != nil {
		t.Fatal("want the first connection faulted and the second skipped (--fault-max-active 1)")
	}
	if _, err := tbl.SetEnabled(idle.Name(), false); err != nil {
		t.Fatal(err)
	}
	expect(t, head+`kubeproxy_userspace_faulted_connections{service_port="default.dns.dns"} 0
kubeproxy_userspace_faulted_connections{service_port="default/web:http"} 1
`+skippedHead+`kubeproxy_userspace_faults_skipped_max_active_total{service_port="default.dns.dns"} 0
kubeproxy_userspace_faults_skipped_max_active_total{service_port="default/web:http"} 1
`+droppedHead+`kubeproxy_userspace_faults_delay_queue_dropped_total{service_port="default.dns.dns"} 0
kubeproxy_userspace_faults_delay_queue_dropped_total{service_port="default/web:http"} 0
`)
	a.Done()
	p.SetDeclared(nil)
	tbl.RemovePort(idle.Name())
	expect(t, head+`kubeproxy_userspace_faulted_connections{service_port="default/web:http"} 0
`+skippedHead+`kubeproxy_userspace_faults_skipped_max_active_total{service_port="default/web:http"} 1
`+droppedHead+`kubeproxy_userspace_faults_delay_queue_dropped_total{service_port="default/web:http"} 0
`)
}

// A removed toxic's faults_injected_total series stays (removed through
// the API or the annotation, or its stream changed), with its count, so a
// toxic added and removed between two scrapes is still seen; up to
// retiredSeriesKept of them per port, the oldest going first: experiments
// that add and remove toxics by the thousand left a series behind for each.
func TestRemovedToxicSeriesStayAWhile(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	tbl := NewTable(0, 0, NewMetrics(reg))
	p := tbl.Port("default.web.http", "TCP")
	p.SetDeclared([]Toxic{toxic(t, `{"name":"slow","type":"latency","attributes":{"latency":1}}`)})
	if _, err := tbl.AddToxic("default.web.http", toxic(t, `{"name":"cut","type":"reset_peer"}`)); err != nil {
		t.Fatal(err)
	}
	series := func() []string {
		t.Helper()
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, mf := range mfs {
			if mf.GetName() != "kubeproxy_userspace_faults_injected_total" {
				continue
			}
			for _, m := range mf.GetMetric() {
				var l []string
				for _, lp := range m.GetLabel() {
					l = append(l, lp.GetValue())
				}
				out = append(out, fmt.Sprintf("%s=%g", strings.Join(l, " "), m.GetCounter().GetValue()))
			}
		}
		return out
	}
	check := func(want ...string) {
		t.Helper()
		if got := series(); strings.Join(got, ", ") != strings.Join(want, ", ") {
			t.Errorf("faults_injected_total series %q, want %q", got, want)
		}
	}
	if c := p.Accept(client1); c == nil {
		t.Fatal("connection not faulted")
	} else {
		c.Done()
	}
	// Label values in the labels' order: service_port, stream, toxic, type.
	check("default.web.http downstream cut reset_peer=1", "default.web.http downstream slow latency=1")
	if _, err := tbl.UpdateToxic("default.web.http", "cut", []byte(`{"stream":"upstream"}`)); err != nil {
		t.Fatal(err)
	}
	check("default.web.http downstream cut reset_peer=1", "default.web.http downstream slow latency=1", "default.web.http upstream cut reset_peer=0")
	if err := tbl.RemoveToxic("default.web.http", "cut"); err != nil {
		t.Fatal(err)
	}
	p.SetDeclared(nil)
	check("default.web.http downstream cut reset_peer=1", "default.web.http downstream slow latency=1", "default.web.http upstream cut reset_peer=0")

	// An experiment's worth of toxics more: the oldest removed go.
	for i := range retiredSeriesKept {
		name := fmt.Sprintf("t%02d", i)
		if _, err := tbl.AddToxic("default.web.http", toxic(t, `{"name":"`+name+`","type":"latency","attributes":{"latency":1}}`)); err != nil {
			t.Fatal(err)
		}
		if err := tbl.RemoveToxic("default.web.http", name); err != nil {
			t.Fatal(err)
		}
	}
	got := series()
	if len(got) != retiredSeriesKept {
		t.Fatalf("%d series after %d toxics were removed, want %d", len(got), retiredSeriesKept+3, retiredSeriesKept)
	}
	if strings.Contains(strings.Join(got, ","), "cut") || !strings.Contains(strings.Join(got, ","), "t00") {
		t.Errorf("series %q: want the oldest removed (cut, slow) gone and t00 kept", got)
	}
}

// A datagram dropped because the port's delay line is full is counted: it
// showed in no metric, only in a -v=2 line.
func TestDelayLineOverflowCounted(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	tbl := NewTable(0, 0, NewMetrics(reg))
	p := tbl.Port("default.dns.dns", "UDP")
	p.SetDeclared([]Toxic{toxic(t, `{"type":"latency","stream":"upstream","attributes":{"latency":60000}}`)})
	r := &recorder{}
	sendAll(p, delayLineMaxDatagrams+5, r)
	const want = `
# HELP kubeproxy_userspace_faults_delay_queue_dropped_total UDP datagrams dropped because the service port's queue of delayed datagrams (one per direction, 10,000 datagrams or 16 MiB), or a reorder toxic's held ones (as many), was full, or faults held --fault-max-buffered-bytes
# TYPE kubeproxy_userspace_faults_delay_queue_dropped_total counter
kubeproxy_userspace_faults_delay_queue_dropped_total{service_port="default.dns.dns"} 5
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "kubeproxy_userspace_faults_delay_queue_dropped_total"); err != nil {
		t.Fatal(err)
	}
	tbl.SetEnabled(p.Name(), false) // ends the delay line's wait
}

// faults_buffered_bytes and faults_max_buffered_bytes show the table's
// bound on what faulted directions hold, and what they hold.
func TestBufferedBytesExposition(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	tbl := NewTable(0, 0, NewMetrics(reg))
	tbl.SetMaxBufferedBytes(256 << 20)
	tbl.buffers.held.Add(1000)
	want := `
# HELP kubeproxy_userspace_faults_buffered_bytes Bytes the faulted TCP directions of every service port hold in flight (read, not yet written), with each one's read in progress, and the UDP datagrams latency delays and reorder holds
# TYPE kubeproxy_userspace_faults_buffered_bytes gauge
kubeproxy_userspace_faults_buffered_bytes 1000
# HELP kubeproxy_userspace_faults_max_buffered_bytes --fault-max-buffered-bytes: the bound of faults_buffered_bytes (0: none); a direction that holds nothing still reads
# TYPE kubeproxy_userspace_faults_max_buffered_bytes gauge
kubeproxy_userspace_faults_max_buffered_bytes 2.68435456e+08
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "kubeproxy_userspace_faults_buffered_bytes", "kubeproxy_userspace_faults_max_buffered_bytes"); err != nil {
		t.Fatal(err)
	}
}

// faults_injected_total counts what acted (README: per connection for TCP,
// per datagram for UDP): not a toxic drawn for a datagram a later toxic
// dropped, nor one drawn for a connection refused at accept; and a UDP
// down, which drops both ways, counts each drop under the stream it was
// dropped on.
func TestInjectedCountsOnlyWhatActed(t *testing.T) {
	const n = 1000
	count := func(m *Metrics, label, name, typ, stream string) int {
		return int(testutil.ToFloat64(m.Injected.WithLabelValues(label, name, typ, stream)))
	}
	t.Run("UDP duplicate, then loss", func(t *testing.T) {
		m := NewMetrics(nil)
		p := NewTable(4, 0, m).Port("default.dns.dns", "UDP")
		p.SetDeclared([]Toxic{
			toxic(t, `{"name":"dup","type":"duplicate","stream":"upstream","attributes":{"rate":1}}`),
			toxic(t, `{"name":"loss","type":"loss","stream":"upstream","attributes":{"rate":0.5}}`),
		})
		r := &recorder{}
		sendAll(p, n, r)
		delivered := len(r.seqs()) / 2 // each twice
		if got := count(m, "default.dns.dns", "dup", "duplicate", Upstream); got != delivered {
			t.Errorf("duplicate counted %d, want the %d datagrams sent twice (%d lost)", got, delivered, n-delivered)
		}
		if got := count(m, "default.dns.dns", "loss", "loss", Upstream); got != n-delivered {
			t.Errorf("loss counted %d, want %d", got, n-delivered)
		}
	})
	t.Run("UDP latency past a full delay line", func(t *testing.T) {
		// A datagram the full delay line dropped was not delayed: counted
		// in delay_queue_dropped, not as latency injected (it was both:
		// 10,005 latency for 10,000 delayed).
		m := NewMetrics(nil)
		tbl := NewTable(4, 0, m)
		p := tbl.Port("default.dns.dns", "UDP")
		p.SetDeclared([]Toxic{toxic(t, `{"name":"lat","type":"latency","stream":"upstream","attributes":{"latency":60000}}`)})
		defer tbl.SetEnabled(p.Name(), false) // ends the delay line's wait
		r := &recorder{}
		sendAll(p, delayLineMaxDatagrams+5, r)
		if got, dropped := count(m, "default.dns.dns", "lat", "latency", Upstream), p.snap.Load().delayDropped.n.Load(); got != delayLineMaxDatagrams || dropped != 5 {
			t.Errorf("latency counted %d, %d dropped by the delay line; want %d and 5", got, dropped, delayLineMaxDatagrams)
		}
	})
	t.Run("TCP latency on refused connections", func(t *testing.T) {
		m := NewMetrics(nil)
		p := NewTable(4, 0, m).Port("default.web.http", "TCP")
		p.SetDeclared([]Toxic{
			toxic(t, `{"name":"lat","type":"latency","attributes":{"latency":50}}`),
			toxic(t, `{"name":"ref","type":"refuse","toxicity":0.5}`),
		})
		refused := 0
		for range n {
			c := p.Accept(client1)
			if c.Refuse {
				refused++
			}
			c.Done()
		}
		if got := count(m, "default.web.http", "lat", "latency", Downstream); got != n-refused {
			t.Errorf("latency counted %d, want the %d connections not refused (%d refused)", got, n-refused, refused)
		}
		if got := count(m, "default.web.http", "ref", "refuse", Downstream); got != refused {
			t.Errorf("refuse counted %d, want %d", got, refused)
		}
	})
	t.Run("UDP down on both streams", func(t *testing.T) {
		m := NewMetrics(nil)
		p := NewTable(4, 0, m).Port("default.dns.dns", "UDP")
		p.SetDeclared([]Toxic{toxic(t, `{"name":"dn","type":"down","toxicity":0.4}`)})
		var dropped [2]int
		buf := make([]byte, 4)
		for range n {
			for _, stream := range []int{StreamUp, StreamDown} {
				sent := false
				p.Datagrams().Send(stream, session1, buf, func([]byte) { sent = true })
				if !sent {
					dropped[stream]++
				}
			}
		}
		for stream, name := range map[int]string{StreamUp: Upstream, StreamDown: Downstream} {
			if got := count(m, "default.dns.dns", "dn", "down", name); got != dropped[stream] {
				t.Errorf("down{stream=%q} counted %d, want the %d dropped on it", name, got, dropped[stream])
			}
		}
	})
}

// A port removed (its Service deleted) while a faulted connection of its
// lives on keeps faulted_connections until that connection ends, so that a
// sum of it is every faulted connection the proxy holds; then its series
// go, as at once for a port with none.
func TestRemovedPortSeriesStayWhileAFaultedConnectionLives(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	tbl := NewTable(0, 0, NewMetrics(reg))
	p := tbl.PortLabeled("default.web.http", "TCP", "default/web:http")
	p.SetDeclared([]Toxic{toxic(t, `{"type":"latency","attributes":{"latency":1}}`)})
	a := p.Accept(client1)
	if a == nil {
		t.Fatal("connection not faulted")
	}
	tbl.RemovePort(p.Name())
	want := `
# HELP kubeproxy_userspace_faulted_connections Live TCP connections with at least one toxic applied
# TYPE kubeproxy_userspace_faulted_connections gauge
kubeproxy_userspace_faulted_connections{service_port="default/web:http"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "kubeproxy_userspace_faulted_connections"); err != nil {
		t.Errorf("the removed port's live faulted connection: %v", err)
	}
	a.Done()
	names := []string{"kubeproxy_userspace_faulted_connections", "kubeproxy_userspace_faults_skipped_max_active_total", "kubeproxy_userspace_faults_delay_queue_dropped_total"}
	if n, err := testutil.GatherAndCount(reg, names...); err != nil || n != 0 {
		t.Errorf("after its last connection ended: %d per-port series (err %v), want none", n, err)
	}
}

// Two ports of one label (an unnamed service port whose number changed: the
// new fault port opens before the old one is removed) share its series,
// which stay while either is there: removing the old one forgot them, and
// the new port's latency went on acting with its faulted_connections and
// faults_injected_total series gone from /metrics.
func TestPortSeriesStayWhileAnotherPortOfTheLabelLives(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	tbl := NewTable(0, 0, NewMetrics(reg))
	names := []string{"kubeproxy_userspace_faulted_connections", "kubeproxy_userspace_faults_skipped_max_active_total",
		"kubeproxy_userspace_faults_delay_queue_dropped_total", "kubeproxy_userspace_faults_injected_total"}
	lat := []Toxic{toxic(t, `{"name":"lat","type":"latency","attributes":{"latency":1}}`)}
	old := tbl.PortLabeled("default.web.80", "TCP", "default/web")
	old.SetDeclared(lat)
	renamed := tbl.PortLabeled("default.web.81", "TCP", "default/web")
	renamed.SetDeclared(lat)
	tbl.RemovePort(old.Name())
	if n, err := testutil.GatherAndCount(reg, names...); err != nil || n != 4 {
		t.Errorf("the old port removed, the new one of its label serving: %d series (err %v), want 4", n, err)
	}
	// A label taken by another port through SetLabel stays too.
	api := tbl.Port("default.web.api", "TCP")
	api.SetLabel("default/web")
	api.SetLabel("default/other")
	if n, err := testutil.GatherAndCount(reg, names...); err != nil || n != 4 {
		t.Errorf("another port relabelled away from the label: %d series (err %v), want 4", n, err)
	}
	tbl.RemovePort(renamed.Name())
	if n, err := testutil.GatherAndCount(reg, names...); err != nil || n != 0 {
		t.Errorf("the label's last port removed: %d series (err %v), want none", n, err)
	}
}

// A faulted port of a label whose old port drains (removed, a faulted
// connection of its live) takes the label's series back: they stay when
// the old connection ends, the new port being there.
func TestPortSeriesOfALabelBackWhileItDrains(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	tbl := NewTable(0, 0, NewMetrics(reg))
	lat := []Toxic{toxic(t, `{"type":"latency","attributes":{"latency":1}}`)}
	old := tbl.PortLabeled("default.web.http", "TCP", "default/web:http")
	old.SetDeclared(lat)
	a := old.Accept(client1)
	if a == nil {
		t.Fatal("connection not faulted")
	}
	tbl.RemovePort(old.Name())
	back := tbl.PortLabeled("default.web.http", "TCP", "default/web:http")
	back.SetDeclared(lat)
	a.Done()
	want := `
# HELP kubeproxy_userspace_faulted_connections Live TCP connections with at least one toxic applied
# TYPE kubeproxy_userspace_faulted_connections gauge
kubeproxy_userspace_faulted_connections{service_port="default/web:http"} 0
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "kubeproxy_userspace_faulted_connections"); err != nil {
		t.Errorf("the re-created port's series after the old connection ended: %v", err)
	}
}
