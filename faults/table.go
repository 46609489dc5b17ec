package faults

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"
	"sync/atomic"

	"k8s.io/klog/v2"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/internal/clip"
)

// Origins of a toxic: declared on the Service, or set through the API.
const (
	OriginAnnotation = "annotation"
	OriginAPI        = "api"
)

// Errors the API maps to Toxiproxy's status codes.
var (
	ErrProxyNotFound = errors.New("proxy not found")
	ErrToxicNotFound = errors.New("toxic not found")
	ErrToxicExists   = errors.New("toxic already exists")
	ErrDeclared      = errors.New("toxic is declared in the Service's annotation; change the annotation instead")
	// ErrNotServing: the port's state changed, but its proxy socket
	// could not follow (a port enabled whose socket cannot listen again:
	// another socket listens on its port). The socket keeps trying.
	ErrNotServing = errors.New("the proxy socket could not follow")
)

// ProxyInfo is what the API shows of a service port.
type ProxyInfo struct {
	Name     string // <namespace>.<service>.<port name or number>
	Protocol string // TCP or UDP
	Listen   string // where a test dials the proxy (the proxier says: its Service's ClusterIP, or its proxy socket)
	Upstream string // endpoints, comma-separated
	Enabled  bool
	Toxics   []ActiveToxic

	formerListens []string // Port.formerListens
	socket        string   // Port.socket
}

// ListensOn reports whether addr, a listen a client sent, names this
// proxy: its listen, one it showed before (a client that fetched the
// proxy then sends it back with Enable and Disable), or its proxy socket.
func (i ProxyInfo) ListensOn(addr string) bool {
	return addr == i.Listen || addr != "" && addr == i.socket || slices.Contains(i.formerListens, addr)
}

// ActiveToxic is a toxic in force on a port, with where it came from.
type ActiveToxic struct {
	Toxic
	Origin string
}

// Table holds every service port's toxics. The proxier adds and removes
// ports and sets annotation toxics on sync; the API sets its own toxics
// and the enabled flag. Data-path readers see an immutable snapshot
// through Port, so they take no lock.
type Table struct {
	seed      int64
	maxActive int
	metrics   *Metrics
	// TrackLive registers every live TCP connection so that a port set
	// down (API, down toxic) cuts them; set it before any Accept when the
	// fault API is served. Off, connections without faults cost nothing:
	// no Conn, so the port cannot cut them, and SetDeclared hands the
	// caller, whose registry holds them, the downs that must (Down).
	TrackLive bool
	// buffers bounds what faulted directions hold in flight
	// (SetMaxBufferedBytes).
	buffers bufferBudget

	mu    sync.Mutex
	ports map[string]*Port
}

// NewTable builds an empty table. seed is --fault-seed; maxActive caps
// faulted live connections per service port (0 = unlimited). What
// faulted directions hold is bounded by DefaultMaxBufferedBytes until
// SetMaxBufferedBytes.
func NewTable(seed int64, maxActive int, m *Metrics) *Table {
	if m == nil {
		m = NewMetrics(nil)
	}
	t := &Table{seed: seed, maxActive: maxActive, metrics: m, ports: map[string]*Port{}}
	t.buffers.max = DefaultMaxBufferedBytes
	m.buffers.Store(&t.buffers)
	return t
}

// Port returns the port named name, creating it (enabled, no toxics).
// info fills what the API shows; its Toxics and Enabled are ignored.
func (t *Table) Port(name, protocol string) *Port {
	return t.PortLabeled(name, protocol, "")
}

// PortLabeled is Port with the metric label (see SetLabel) a new port's
// series start with: creating them under the API name and renaming them
// at once cost a second set of series per port (10,000 at a first sync).
func (t *Table) PortLabeled(name, protocol, label string) *Port {
	t.mu.Lock()
	defer t.mu.Unlock()
	p := t.ports[name]
	if p == nil {
		p = newPort(t, name, protocol, label)
		t.ports[name] = p
	}
	return p
}

// Declare sets the annotation toxics of an existing port and reports
// whether it exists; a port not yet open gets them when it opens. cut is
// SetDeclared's.
func (t *Table) Declare(name string, toxics []Toxic) (cut []Down, ok bool) {
	t.mu.Lock()
	p := t.ports[name]
	t.mu.Unlock()
	if p == nil {
		return nil, false
	}
	return p.SetDeclared(toxics), true
}

// RemovePort forgets a service port that is gone, API toxics included.
// The connections its timeout toxics hold end, and those its bandwidth 0
// toxics hold flow on, as at the toxics' removal: forgotten with the port,
// they were held until the client closed, out of reach of the API (404)
// and of /reset.
func (t *Table) RemovePort(name string) {
	t.mu.Lock()
	p := t.ports[name]
	delete(t.ports, name)
	t.mu.Unlock()
	if p == nil {
		return
	}
	p.mu.Lock()
	// Under mu, with the series forgotten: a change that looked the port
	// up before it went (an API call racing the sync) finds it removed
	// and publishes nothing, so it cannot bring the series back (gone).
	// Before the scan of live connections: one attached after it sees
	// removed (AttachReset).
	p.removed.Store(true)
	t.metrics.release(p.metricLabel())
	held := p.holdsLocked()
	p.mu.Unlock()
	p.releaseRemovedHolds(held)
	// The datagrams its toxics still delay or hold can never be delivered
	// (the port's sessions and socket are closed): kept, they held
	// --fault-max-buffered-bytes for the rest of their delay, so another
	// port's latency dropped its datagrams meanwhile.
	var plan *datagramPlan
	if s := p.snap.Load(); s != nil {
		plan = s.datagram
	}
	p.dropDelayedDatagrams(nil, plan)
}

func (t *Table) lookup(name string) (*Port, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if p := t.ports[name]; p != nil {
		return p, nil
	}
	return nil, fmt.Errorf("%w: %s", ErrProxyNotFound, clip.String(name))
}

// goneLocked reports whether RemovePort removed the port, with the error
// an API change then gets (the API answers 404, as when its lookup came
// after the removal); p.mu is held. A change must not publish then: a
// snapshot creates the port's series again (publishLocked), for a label
// no port owns, which nothing would ever delete.
func (p *Port) goneLocked() error {
	if p.removed.Load() {
		return fmt.Errorf("%w: %s", ErrProxyNotFound, p.name)
	}
	return nil
}

// lockLive takes p.mu for an API change, unless RemovePort removed the
// port: then it returns goneLocked's error, p.mu not held.
func (p *Port) lockLive() error {
	p.mu.Lock()
	if err := p.goneLocked(); err != nil {
		p.mu.Unlock()
		return err
	}
	return nil
}

// Proxies lists every port, sorted by name.
func (t *Table) Proxies() []ProxyInfo {
	t.mu.Lock()
	ports := make([]*Port, 0, len(t.ports))
	for _, p := range t.ports {
		ports = append(ports, p)
	}
	t.mu.Unlock()
	out := make([]ProxyInfo, 0, len(ports))
	for _, p := range ports {
		out = append(out, p.Info())
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Proxy returns one port's info.
func (t *Table) Proxy(name string) (ProxyInfo, error) {
	p, err := t.lookup(name)
	if err != nil {
		return ProxyInfo{}, err
	}
	return p.Info(), nil
}

// Exists returns Proxy's error for a port that does not exist, nil for
// one that does, without Proxy's copy of every toxic: the API checks the
// proxy before it reads a request's body, and with that copy an add to a
// port of 3,000 toxics spent half its time there.
func (t *Table) Exists(name string) error {
	_, err := t.lookup(name)
	return err
}

// SetEnabled turns a port up or down. Down refuses new connections with a
// reset (UDP: drops datagrams) and cuts live ones. An error that wraps
// ErrNotServing comes with the info: the port is set, but its socket does
// not serve it (yet).
func (t *Table) SetEnabled(name string, enabled bool) (ProxyInfo, error) {
	p, err := t.lookup(name)
	if err != nil {
		return ProxyInfo{}, err
	}
	err = p.setEnabled(enabled)
	return p.Info(), err
}

// AddToxic adds an API toxic to a port.
func (t *Table) AddToxic(name string, tx Toxic) (Toxic, error) {
	p, err := t.lookup(name)
	if err != nil {
		return Toxic{}, err
	}
	// The protocol before the attributes, as in the annotation (a type
	// unknown is Normalize's error).
	if _, known := toxicTypes[tx.Type]; known && !tx.AppliesTo(p.protocol) {
		return Toxic{}, &FieldError{"type", fmt.Sprintf("%s acts on %s, and %s is %s%s", tx.Type, protocolsOf(tx.Type), name, p.protocol, othersFor(p.protocol))}
	}
	if err := tx.Normalize(); err != nil {
		return Toxic{}, err
	}
	if tx.Port != "" {
		return Toxic{}, &FieldError{"port", "not allowed through the API: the proxy is already one service port"}
	}
	if err := p.addAPI(tx); err != nil {
		return Toxic{}, err
	}
	return tx, nil
}

// UpdateToxic merges patch (Toxiproxy's update body: any of toxicity,
// attributes, stream) into an API toxic.
func (t *Table) UpdateToxic(name, toxic string, patch []byte) (Toxic, error) {
	p, err := t.lookup(name)
	if err != nil {
		return Toxic{}, err
	}
	return p.updateAPI(toxic, patch)
}

// RemoveToxic removes an API toxic.
func (t *Table) RemoveToxic(name, toxic string) error {
	p, err := t.lookup(name)
	if err != nil {
		return err
	}
	return p.removeAPI(toxic)
}

// Toxic returns one toxic in force on a port.
func (t *Table) Toxic(name, toxic string) (ActiveToxic, error) {
	p, err := t.lookup(name)
	if err != nil {
		return ActiveToxic{}, err
	}
	for _, a := range p.Info().Toxics {
		if a.Name == toxic {
			return a, nil
		}
	}
	return ActiveToxic{}, fmt.Errorf("%w: %s", ErrToxicNotFound, clip.String(toxic))
}

// Reset removes every API toxic and enables every port; annotation toxics
// stay, since they are declared. Connections and datagrams are numbered
// from 0 again, as after a restart. Its error wraps ErrNotServing, for the
// ports whose sockets could not listen again.
func (t *Table) Reset() error {
	t.mu.Lock()
	ports := make([]*Port, 0, len(t.ports))
	for _, p := range t.ports {
		ports = append(ports, p)
	}
	t.mu.Unlock()
	var errs []error
	for _, p := range ports {
		if err := p.reset(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Port is one service port's fault state. Writers hold mu and publish a
// new immutable snapshot; the data path only loads it.
type Port struct {
	table    *Table
	name     string
	protocol string

	mu         sync.Mutex
	label      string
	listen     string
	upstream   string
	upstreamFn func() string
	enabled    bool
	annotation []Toxic
	api        []Toxic
	// formerListens are the listens the port showed before its current
	// one, oldest first, at most keptFormerListens (ProxyInfo.ListensOn);
	// under mu, replaced and never written in place.
	formerListens []string
	// socket is the proxy socket's address where listen is another one
	// (SetSocket); under mu.
	socket string

	snap atomic.Pointer[snapshot]
	// retired: faults_injected_total series of removed toxics, kept a
	// while (retireRemoved), oldest first; under mu.
	retired []seriesKey
	// connSeq numbers every connection (TCP) accepted on the port, faulted
	// or not, so draws depend only on the seed and the arrival order.
	connSeq atomic.Uint64
	// udpSeq numbers datagrams per stream (up, down).
	udpSeq [2]atomic.Uint64
	// udpDelays holds each stream's delayed datagrams (latency).
	udpDelays [2]delayLine
	// active counts live faulted connections, for the max-active cap.
	active atomic.Int64
	// removed: RemovePort forgot the port, and ended what its timeout
	// toxics held.
	removed atomic.Bool

	liveMu sync.Mutex
	live   map[*liveConn]struct{}

	// watchMu serialises changes of enabled with their notices to
	// watchers (OnEnabled), so a socket learns them in their order.
	watchMu  sync.Mutex
	watchers []*enabledWatcher
}

type enabledWatcher struct{ f func(enabled bool) error }

// OnEnabled has f told the port's enabled state: now when the port is
// down, then at every change, in order, and at every enable of a port
// already up (f must not call back into the port, and takes a repeated
// true as a chance to retry what it could not do). A TCP proxy socket stops listening while its port is down, so
// that a connect is refused as at Toxiproxy's disabled proxy, whose
// listener is closed. f's error (it could not follow) is the change's
// (ErrNotServing). stop ends the notices.
func (p *Port) OnEnabled(f func(enabled bool) error) (stop func()) {
	w := &enabledWatcher{f}
	p.watchMu.Lock()
	defer p.watchMu.Unlock()
	p.watchers = append(p.watchers, w)
	p.mu.Lock()
	enabled := p.enabled
	p.mu.Unlock()
	if !enabled {
		_ = f(false) // the socket logs it; no one asked
	}
	return func() {
		p.watchMu.Lock()
		defer p.watchMu.Unlock()
		p.watchers = slices.DeleteFunc(p.watchers, func(x *enabledWatcher) bool { return x == w })
	}
}

// notifyEnabled runs under watchMu.
func (p *Port) notifyEnabled(enabled bool) error {
	var errs []error
	for _, w := range p.watchers {
		if err := w.f(enabled); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) == 0 {
		return nil
	}
	return fmt.Errorf("%w: proxy %s: %w", ErrNotServing, p.name, errors.Join(errs...))
}

func newPort(t *Table, name, protocol, label string) *Port {
	p := &Port{table: t, name: name, protocol: protocol, label: label, enabled: true, live: map[*liveConn]struct{}{}}
	p.udpDelays[0].budget, p.udpDelays[1].budget = &t.buffers, &t.buffers
	t.metrics.hold(p.metricLabel())
	p.publishLocked()
	return p
}

// keptFormerListens bounds the listens a port keeps accepting after it
// moved (a Service's port edited in place, again and again).
const keptFormerListens = 8

// SetAddresses records what the API shows as listen and upstream. A listen
// it replaces stays one the API accepts back (ProxyInfo.ListensOn), as a
// stale upstream is: Toxiproxy's client sends the whole proxy with Enable
// and Disable, and one that fetched it before the move was refused, the
// proxy left down.
func (p *Port) SetAddresses(listen, upstream string) {
	p.mu.Lock()
	if p.listen != "" && p.listen != listen {
		former := slices.DeleteFunc(slices.Clone(p.formerListens), func(a string) bool { return a == p.listen || a == listen })
		if len(former) >= keptFormerListens {
			former = former[1:]
		}
		p.formerListens = append(former, p.listen)
	}
	p.listen, p.upstream = listen, upstream
	p.mu.Unlock()
}

// SetSocket records the port's proxy socket, where listen names another
// address (its Service's ClusterIP): the API takes it back as listen
// (ProxyInfo.ListensOn), as it was what listen showed in earlier releases
// and is what /debug/services shows, so a client's copy holding it is not
// refused as a move.
func (p *Port) SetSocket(addr string) {
	p.mu.Lock()
	p.socket = addr
	p.mu.Unlock()
}

// SetUpstreamFunc makes the API show upstream() (the current endpoints)
// instead of a fixed upstream.
func (p *Port) SetUpstreamFunc(upstream func() string) {
	p.mu.Lock()
	p.upstreamFn = upstream
	p.mu.Unlock()
}

// SetDeclared replaces the annotation toxics (already normalized and
// filtered for this port). A down toxic it brings (or whose draw it
// changes) cuts the live connections it draws; those the port does not
// track (a TCP port without Table.TrackLive: the connections that drew no
// fault) are the caller's to cut: cut lists the downs that must.
func (p *Port) SetDeclared(toxics []Toxic) (cut []Down) {
	p.mu.Lock()
	if toxicsEqual(p.annotation, toxics) || p.goneLocked() != nil {
		p.mu.Unlock()
		return nil
	}
	before := p.holdsLocked()
	cutting := p.newDownsLocked(toxics)
	p.annotation = toxics
	// A name is one toxic: an API toxic whose name the annotation now
	// declares gives way to it (the Service is the declared state), else
	// the API listed both, found one by GET and deleted the other.
	declared := func(tx Toxic) bool {
		return slices.ContainsFunc(toxics, func(d Toxic) bool { return d.Name == tx.Name })
	}
	if slices.ContainsFunc(p.api, declared) {
		kept := make([]Toxic, 0, len(p.api))
		for _, tx := range p.api {
			if declared(tx) {
				klog.InfoS("A fault API toxic gives way to the Service's annotation toxic of the same name", "proxy", p.name, "toxic", tx.Name)
				continue
			}
			kept = append(kept, tx)
		}
		p.api = kept
	}
	s := p.publishLocked()
	gone := removedHolds(before, p.holdsLocked())
	p.mu.Unlock()
	// As at the API's removal: a timeout or bandwidth 0 the Service no
	// longer declares (or an API one that gave way) must not hold its
	// connections for ever.
	p.releaseRemovedHolds(gone)
	// A down the Service now declares cuts its share of the live
	// connections, as one added through the API does (its purpose).
	untracked := p.protocol == "TCP" && !p.table.TrackLive
	for _, tx := range cutting {
		if t := p.cutDown(s, tx); t != nil && untracked {
			cut = append(cut, Down{p, t})
		}
	}
	return cut
}

// newDownsLocked lists the down toxics of declared that cut live
// connections when declared: those new on the port, or whose draw
// (toxicity, clients, seed) differs from the down of that name already
// there (annotation or API), which cut or refused its share already.
func (p *Port) newDownsLocked(declared []Toxic) []Toxic {
	var downs []Toxic
	for _, tx := range declared {
		if tx.Type != "down" {
			continue
		}
		i := slices.IndexFunc(p.annotation, func(c Toxic) bool { return c.Name == tx.Name })
		cur, had := Toxic{}, i >= 0
		if had {
			cur = p.annotation[i]
		} else if i = slices.IndexFunc(p.api, func(c Toxic) bool { return c.Name == tx.Name }); i >= 0 {
			cur, had = p.api[i], true
		}
		if had && cur.Type == "down" && !downDrawChanged(cur, tx) {
			continue
		}
		downs = append(downs, tx)
	}
	return downs
}

// Name is the port's API name.
func (p *Port) Name() string { return p.name }

// Info is the port as the API shows it.
func (p *Port) Info() ProxyInfo {
	p.mu.Lock()
	fn := p.upstreamFn
	p.mu.Unlock()
	var upstream string
	if fn != nil {
		upstream = fn() // outside p.mu: it takes the balancer's lock
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if fn != nil {
		p.upstream = upstream
	}
	info := ProxyInfo{Name: p.name, Protocol: p.protocol, Listen: p.listen, Upstream: p.upstream, Enabled: p.enabled,
		Toxics: []ActiveToxic{}, formerListens: p.formerListens, socket: p.socket}
	for _, tx := range p.annotation {
		info.Toxics = append(info.Toxics, ActiveToxic{tx.clone(), OriginAnnotation})
	}
	for _, tx := range p.api {
		info.Toxics = append(info.Toxics, ActiveToxic{tx.clone(), OriginAPI})
	}
	return info
}

func (p *Port) setEnabled(enabled bool) error {
	p.watchMu.Lock()
	if err := p.lockLive(); err != nil {
		p.watchMu.Unlock()
		return err
	}
	changed := p.enabled != enabled
	p.enabled = enabled
	if changed {
		p.publishLocked()
	}
	p.mu.Unlock()
	var err error
	if changed || enabled {
		// New connections are refused before the live ones are cut,
		// so that a client cut now cannot reconnect. An enable of a port
		// already up is told too: a socket that could not listen again
		// tries now and answers why not (a client retrying a 503 got
		// success while the port stayed unserved).
		err = p.notifyEnabled(enabled)
	}
	p.watchMu.Unlock()
	if changed && !enabled {
		p.cutLive(func(*liveConn) bool { return true })
	}
	return err
}

func (p *Port) findLocked(name string) (int, bool) {
	for i, tx := range p.api {
		if tx.Name == name {
			return i, true
		}
	}
	for _, tx := range p.annotation {
		if tx.Name == name {
			return -1, true
		}
	}
	return -1, false
}

func (p *Port) addAPI(tx Toxic) error {
	if err := p.lockLive(); err != nil {
		return err
	}
	if i, found := p.findLocked(tx.Name); found {
		p.mu.Unlock()
		if i < 0 { // the annotation's: the tester may not know it is there
			return fmt.Errorf("%w: %s, declared in the Service's %s annotation (change it there, or give this toxic another name)", ErrToxicExists, tx.Name, Annotation)
		}
		return fmt.Errorf("%w: %s", ErrToxicExists, tx.Name)
	}
	p.api = append(p.api, tx)
	s := p.publishLocked()
	p.mu.Unlock()
	if tx.Type == "down" {
		p.cutDown(s, tx)
	}
	return nil
}

// downDrawChanged: an update of a down toxic changes which connections it
// takes (toxicity, clients, seed), so it cuts its share again; an update
// that changes none of them leaves live connections alone: those it draws
// were cut when it came, or refused at accept.
func downDrawChanged(cur, next Toxic) bool {
	sameSeed := cur.Seed == next.Seed || (cur.Seed != nil && next.Seed != nil && *cur.Seed == *next.Seed)
	return cur.Toxicity != next.Toxicity || !slices.Equal(cur.Clients, next.Clients) || !sameSeed
}

func (p *Port) updateAPI(name string, patch []byte) (Toxic, error) {
	if err := p.lockLive(); err != nil {
		return Toxic{}, err
	}
	i, found := p.findLocked(name)
	if !found {
		p.mu.Unlock()
		return Toxic{}, fmt.Errorf("%w: %s", ErrToxicNotFound, clip.String(name))
	}
	if i < 0 {
		p.mu.Unlock()
		return Toxic{}, fmt.Errorf("%w: %s", ErrDeclared, clip.String(name))
	}
	cur := p.api[i].clone()
	wasGilbertElliott := cur.Type == "loss" && cur.Attributes["p"] > 0
	type plain Toxic
	v := struct {
		plain
		Attributes map[string]*float64 `json:"attributes"` // shadows plain's
	}{plain: plain(cur)}
	dec := json.NewDecoder(bytes.NewReader(patch))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&v); err != nil {
		p.mu.Unlock()
		// Named as AddToxic's body errors are (a wrong type, an unknown
		// field), not in Go terms ("Go struct field plain.toxicity").
		var fe *FieldError
		if err = fieldOf(err, patch); !errors.As(err, &fe) {
			fe = &FieldError{"body", err.Error()}
		}
		return Toxic{}, fe
	}
	next := Toxic(v.plain)
	if next.Stream == "" {
		// No stream, as absent: the toxic stays where it is (on create ""
		// is the default, downstream; here it moved an upstream toxic).
		next.Stream = cur.Stream
	}
	if next.Port != cur.Port {
		p.mu.Unlock()
		return Toxic{}, &FieldError{"port", "not allowed through the API: the proxy is already one service port"}
	}
	// Attributes merge: those not given (or given as null) keep their
	// value. A name in another case is the attribute's (as Toxiproxy
	// reads it), so it replaces the value rather than standing beside it.
	patchAttrs, err := canonicalAttributes(cur.Type, givenAttributes(cur.Type, v.Attributes))
	if err != nil {
		p.mu.Unlock()
		return Toxic{}, err
	}
	merged := cur.Attributes
	for k, val := range patchAttrs {
		merged[k] = val
	}
	if cur.Type == "loss" {
		if err := switchLossModel(wasGilbertElliott, patchAttrs, merged); err != nil {
			p.mu.Unlock()
			return Toxic{}, err
		}
	}
	next.Attributes = merged
	next.Name, next.Type = cur.Name, cur.Type
	if err := next.Normalize(); err != nil {
		p.mu.Unlock()
		return Toxic{}, err
	}
	p.api = append(append([]Toxic{}, p.api[:i]...), append([]Toxic{next}, p.api[i+1:]...)...)
	s := p.publishLocked()
	p.mu.Unlock()
	if next.Type == "down" && downDrawChanged(cur, next) {
		p.cutDown(s, next) // as when added: its share of live connections goes
	}
	if next.Stream != cur.Stream {
		// Moved to the other stream, a timeout or bandwidth 0 leaves the
		// one whose connections it holds, as if removed there (as in
		// SetDeclared).
		p.releaseRemovedHolds(holdsOf(nil, []Toxic{cur}, OriginAPI))
	}
	return next, nil
}

// switchLossModel lets an update of a loss toxic move it from one model to
// the other by giving the other model's attributes alone: merged with what
// the toxic held, rate and p > 0 came out both given and the update was
// refused for a rate the client never sent, and p 0 on a Gilbert-Elliott
// toxic silently left random loss at its default rate 1 (every datagram).
func switchLossModel(wasGilbertElliott bool, patch, merged map[string]float64) error {
	_, rateGiven := patch["rate"]
	pGiven, hasP := patch["p"]
	switch {
	case rateGiven && !hasP:
		merged["p"] = 0 // random loss from now on
	case hasP && pGiven > 0 && !rateGiven:
		delete(merged, "rate") // Gilbert-Elliott from now on
	case hasP && pGiven == 0 && !rateGiven && wasGilbertElliott:
		return &FieldError{"attributes.p", "0 ends the Gilbert-Elliott model, which would leave random loss at rate 1 (every datagram): give rate too (0 for none), or remove the toxic"}
	}
	return nil
}

func (p *Port) removeAPI(name string) error {
	if err := p.lockLive(); err != nil {
		return err
	}
	i, found := p.findLocked(name)
	if !found {
		p.mu.Unlock()
		return fmt.Errorf("%w: %s", ErrToxicNotFound, clip.String(name))
	}
	if i < 0 {
		p.mu.Unlock()
		return fmt.Errorf("%w: %s", ErrDeclared, clip.String(name))
	}
	removed := p.api[i]
	p.api = append(append([]Toxic{}, p.api[:i]...), p.api[i+1:]...)
	p.publishLocked()
	p.mu.Unlock()
	p.releaseRemovedHolds(holdsOf(nil, []Toxic{removed}, OriginAPI))
	return nil
}

// holdKey is what makes a toxic that holds live connections until it is
// removed (a timeout, a bandwidth 0) the one a connection holds: its name,
// origin and stream. A change that keeps them is an update, which reaches
// new connections only; one that takes the key away (removed, another
// type or stream, an API toxic giving way) removes it.
type holdKey struct{ name, origin, stream string }

// holdsOf appends the keys of the toxics among toxics whose removal
// reaches the live connections they hold (holdsUntilRemoved).
func holdsOf(keys []holdKey, toxics []Toxic, origin string) []holdKey {
	for _, t := range toxics {
		if holdsUntilRemoved(t.Type) {
			keys = append(keys, holdKey{t.Name, origin, t.Stream})
		}
	}
	return keys
}

// holdsUntilRemoved tells whether a toxic of type typ holds the live
// connections it applies to until it is removed, which reaches them, as
// Toxiproxy's removal does: a timeout ends them with a FIN (its Cleanup
// closes the stub), a bandwidth 0 lets what it holds flow on (its toxic,
// interrupted, writes the held chunk on). A bandwidth of another rate keys
// too: an update to or from 0 keeps the key and reaches new connections
// only, as an update does.
func holdsUntilRemoved(typ string) bool { return typ == "timeout" || typ == "bandwidth" }

// holdsLocked are the keys of the port's holding toxics; p.mu is held.
func (p *Port) holdsLocked() []holdKey {
	return holdsOf(holdsOf(nil, p.annotation, OriginAnnotation), p.api, OriginAPI)
}

// removedHolds are the keys in before that after lacks.
func removedHolds(before, after []holdKey) []holdKey {
	var gone []holdKey
	for _, k := range before {
		if !slices.Contains(after, k) {
			gone = append(gone, k)
		}
	}
	return gone
}

func (p *Port) reset() error {
	p.watchMu.Lock()
	defer p.watchMu.Unlock()
	if p.lockLive() != nil {
		return nil // went since /reset listed it: nothing left to reset
	}
	removed := holdsOf(nil, p.api, OriginAPI)
	p.api = nil
	p.enabled = true
	// Numbered from 0 again, as after a restart: a suite that resets
	// between its tests gets a test's faults from the seed and that
	// test's arrival order. The numbers went on, so on a proxy that keeps
	// running the same test drew other faults every time.
	p.connSeq.Store(0)
	for i := range p.udpSeq {
		p.udpSeq[i].Store(0)
	}
	p.publishLocked().datagram.restart()
	p.mu.Unlock()
	p.releaseRemovedHolds(removed)
	return p.notifyEnabled(true) // up already: as a repeated enable (setEnabled)
}

func toxicsEqual(a, b []Toxic) bool {
	if len(a) != len(b) {
		return false
	}
	if len(a) == 0 {
		return true // every unannotated port, every sync
	}
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	return bytes.Equal(ja, jb)
}
