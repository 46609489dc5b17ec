package proxier

import (
	"cmp"
	"encoding/json"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/faults"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/loadbalancer"
)

// DebugServicePort is one row of /debug/services.
type DebugServicePort struct {
	ServicePort  string          `json:"servicePort"`
	Protocol     string          `json:"protocol"`
	ProxyAddress string          `json:"proxyAddress"`
	ServiceIPs   []string        `json:"serviceIPs,omitempty"`
	Port         int             `json:"port"`
	NodePort     int             `json:"nodePort,omitempty"`
	Affinity     string          `json:"sessionAffinity"`
	TimeoutSec   int             `json:"affinityTimeoutSeconds,omitempty"`
	Endpoints    []string        `json:"endpoints"`
	Clients      []DebugAffinity `json:"affinity,omitempty"`
	// AffinityEvicted counts clients the affinity table's cap pushed out.
	AffinityEvicted uint64 `json:"affinityEvicted,omitempty"`
	// FaultProxy is the port's name in the fault API; FaultsEnabled is
	// false while the API holds it down; Faults are its toxics in force.
	// ExternalProxyAddress is the second socket a port with external
	// addresses has under a Local traffic policy (splitExternal), where
	// its external traffic (LB IPs, external IPs, NodePorts from other
	// hosts) goes, or with both policies Local the node's and pods'
	// traffic to them; ExternalEndpoints are that socket's endpoints:
	// this node's own under externalTrafficPolicy Local alone, else every
	// node's.
	ExternalProxyAddress string       `json:"externalProxyAddress,omitempty"`
	ExternalEndpoints    []string     `json:"externalEndpoints,omitempty"`
	FaultProxy           string       `json:"faultProxy"`
	FaultsEnabled        bool         `json:"faultsEnabled"`
	Faults               []DebugToxic `json:"faults,omitempty"`
	// FaultsError says why the Service's faults annotation is not in
	// force: from an API server, which stores any annotation, Faults are
	// then the last valid annotation's toxics (none for a Service that
	// never had one), and only a log line said so. (From --manifests an
	// invalid Service is not taken at all: its last good version serves.)
	FaultsError string `json:"faultsError,omitempty"`
	// Error says why the port has no proxy socket (its proxyAddress is
	// empty): the last sync could not open one, and retries; or why its
	// socket does not serve: the fault API enabled the port, and the
	// socket cannot listen again (retried); or why the second socket a
	// Local traffic policy needs is missing (no ExternalProxyAddress):
	// the last sync could not open it, and retries.
	Error string `json:"error,omitempty"`
}

// DebugToxic is a toxic in force, with where it came from (annotation or api).
type DebugToxic struct {
	faults.Toxic
	Origin string `json:"origin"`
}

// UnmarshalJSON reads a row as /debug/services writes it. Without it the
// embedded Toxic's strict decoder is promoted and refuses "origin", so no
// Go client could decode a port that has faults.
func (d *DebugToxic) UnmarshalJSON(b []byte) error {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(b, &fields); err != nil {
		return err
	}
	var origin string
	if raw, ok := fields["origin"]; ok {
		if err := json.Unmarshal(raw, &origin); err != nil {
			return &faults.FieldError{Field: "origin", Reason: "must be a JSON string, not " + string(raw)}
		}
		delete(fields, "origin")
	}
	rest, err := json.Marshal(fields)
	if err != nil {
		return err
	}
	var t faults.Toxic
	if err := json.Unmarshal(rest, &t); err != nil {
		return err
	}
	*d = DebugToxic{Toxic: t, Origin: origin}
	return nil
}

// DebugAffinity is one client pinned to an endpoint.
type DebugAffinity struct {
	ClientIP string    `json:"clientIP"`
	Endpoint string    `json:"endpoint"`
	LastUsed time.Time `json:"lastUsed"`
}

// DebugServices lists every proxied service port with its proxy address,
// endpoints and affinity table.
func (p *Proxier) DebugServices() []DebugServicePort {
	p.debugMu.RLock()
	rows, failed := p.debug, p.debugFailed
	p.debugMu.RUnlock()
	deaf := p.sockCfg.deaf.errors()
	out := make([]DebugServicePort, 0, len(rows))
	for _, r := range rows {
		d := infoRow(r.name, r.info)
		d.ProxyAddress = net.JoinHostPort(p.listenHostOf(r.info), strconv.Itoa(r.proxyPort))
		if deaf != nil {
			d.Error = cmp.Or(deaf[r.name], deaf[externalName(r.name)])
		}
		// Its second socket did not open: its external addresses have no
		// portal (externalTrafficPolicy Local alone) or send the node and
		// pods to this socket's endpoints meanwhile.
		d.Error = cmp.Or(d.Error, r.externalErr)
		if info, err := p.opts.Faults.Proxy(r.info.faultName); err == nil {
			d.FaultsEnabled = info.Enabled
			for _, t := range info.Toxics {
				d.Faults = append(d.Faults, DebugToxic{Toxic: t.Toxic, Origin: t.Origin})
			}
		}
		if r.externalPort != 0 {
			d.ExternalProxyAddress = net.JoinHostPort(p.listenHostOf(r.info), strconv.Itoa(r.externalPort))
			d.ExternalEndpoints = []string{}
			if snap, ok := p.lb.Snapshot(externalName(r.name)); ok {
				for _, ep := range snap.Endpoints {
					d.ExternalEndpoints = append(d.ExternalEndpoints, ep.String())
				}
			}
		}
		if snap, ok := p.lb.Snapshot(r.name); ok {
			for _, ep := range snap.Endpoints {
				d.Endpoints = append(d.Endpoints, ep.String())
			}
			if snap.Affinity.ClientIP {
				d.Affinity = "ClientIP"
				d.TimeoutSec = int(snap.Affinity.Timeout / time.Second)
			}
			d.AffinityEvicted = snap.Evicted
			for _, c := range snap.Clients {
				d.Clients = append(d.Clients, DebugAffinity{ClientIP: c.ClientIP.String(), Endpoint: c.Endpoint.String(), LastUsed: c.LastUsed})
			}
		}
		out = append(out, d)
	}
	if len(failed) > 0 {
		for _, f := range failed {
			d := f.row()
			// Not held down by the fault API unless it says so: the port
			// is not in its table while no socket opened (zero, false,
			// read as "disabled").
			d.FaultsEnabled = true
			if info, err := p.opts.Faults.Proxy(f.info.faultName); err == nil {
				d.FaultsEnabled = info.Enabled
			}
			out = append(out, d)
		}
		slices.SortStableFunc(out, func(a, b DebugServicePort) int { return strings.Compare(a.ServicePort, b.ServicePort) })
	}
	return out
}

// debugFailure is a wanted service port whose proxy socket did not open.
type debugFailure struct {
	name loadbalancer.ServicePortName
	info *servicePortInfo
	err  string
}

// row is the failure's /debug/services row: no proxy address, the error,
// and the affinity the Service asks for (there is no balancer entry).
func (f debugFailure) row() DebugServicePort {
	d := infoRow(f.name, f.info)
	d.Error = f.err
	if f.info.affinity.ClientIP {
		d.Affinity = "ClientIP"
		d.TimeoutSec = int(f.info.affinity.Timeout / time.Second)
	}
	return d
}

// infoRow is the part of a service port's row its Service gives: name,
// addresses, ports, fault API name; endpoints empty, affinity None.
func infoRow(name loadbalancer.ServicePortName, info *servicePortInfo) DebugServicePort {
	d := DebugServicePort{
		ServicePort: info.key,
		Protocol:    string(name.Protocol),
		Port:        info.port,
		NodePort:    info.nodePort,
		Affinity:    "None",
		Endpoints:   []string{},
		FaultProxy:  info.faultName,
	}
	if info.faultsErr != nil {
		d.FaultsError = "metadata.annotations[" + faults.Annotation + "]: " + info.faultsErr.Error()
	}
	for _, group := range [][]netip.Addr{info.clusterIPs, info.externalIPs, info.loadBalancerIPs} {
		d.ServiceIPs = append(d.ServiceIPs, addrStrings(group)...)
	}
	return d
}

// publishOpenFailures publishes the service ports this sync could not open
// (only the sync writes them), so /debug/services lists every wanted port:
// a port that failed to open was missing from it, its only trace a log line.
func (p *Proxier) publishOpenFailures(fails []debugFailure) {
	if len(fails) == 0 && len(p.debugFailed) == 0 {
		return
	}
	slices.SortFunc(fails, func(a, b debugFailure) int { return strings.Compare(a.info.key, b.info.key) })
	p.debugMu.Lock()
	p.debugFailed = fails
	p.debugMu.Unlock()
}

// ProxyPort returns the local port serving name ("ns/svc:port"), for the
// demo and tests.
func (p *Proxier) ProxyPort(servicePort string) (int, bool) {
	p.debugMu.RLock()
	defer p.debugMu.RUnlock()
	for _, r := range p.debug {
		if r.key == servicePort {
			return r.proxyPort, true
		}
	}
	return 0, false
}

// DebugHandler serves DebugServices as JSON.
func (p *Proxier) DebugHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(p.DebugServices())
	})
}

// debugPort is one row of /debug/services.
type debugPort struct {
	name      loadbalancer.ServicePortName
	key       string // name.String()
	proxyPort int
	// externalPort is the socket of external traffic under
	// externalTrafficPolicy: Local (0: none).
	externalPort int
	// externalErr is why the second socket a split policy needs did not
	// open (activePort.externalErr).
	externalErr string
	info        *servicePortInfo
}

func (p *Proxier) publishDebug() {
	touched := p.debugTouched
	p.debugTouched = nil
	rows, ok := p.debugMerged(p.debug, touched)
	if !ok {
		p.debugRebuilds++
		rows = p.debugRows()
	} else if rows == nil {
		return // nothing changed: the published rows stay
	}
	p.debugMu.Lock()
	p.debug = rows
	p.debugMu.Unlock()
}

func debugRow(name loadbalancer.ServicePortName, ap *activePort) debugPort {
	return debugPort{name: name, key: ap.info.key, proxyPort: ap.proxyPort, externalPort: ap.externalPort, externalErr: ap.externalErr, info: ap.info}
}

func compareDebugRows(a, b debugPort) int { return strings.Compare(a.key, b.key) }

// debugRows builds the rows from scratch.
func (p *Proxier) debugRows() []debugPort {
	rows := make([]debugPort, 0, len(p.active))
	for name, ap := range p.active {
		rows = append(rows, debugRow(name, ap))
	}
	// Keys are built once per service port, not per comparison: at 10,000
	// service ports the comparator ran String() ~280,000 times per sync.
	slices.SortFunc(rows, compareDebugRows)
	return rows
}

// debugMerged brings prev, the rows published last (only the sync writes
// them, so it reads them without the lock), up to date with the service
// ports touched since (opened, closed or changed): their old rows are
// dropped and the rows of those still open sorted on their own and merged
// in. A Service change at 10,000 service ports sorts a row or two instead
// of 10,000 (the sort was a fifth of its sync) and looks nothing up for
// the rest. rows nil and ok: nothing changed; not ok: rebuild (the first
// publish, or most ports touched). Published rows are never written again:
// DebugServices reads them after unlocking.
func (p *Proxier) debugMerged(prev []debugPort, touched []loadbalancer.ServicePortName) (rows []debugPort, ok bool) {
	switch {
	case len(touched) == 0:
		return nil, prev != nil || len(p.active) == 0
	case prev == nil || len(touched) > len(prev)/4:
		return nil, false
	}
	seen := make(map[loadbalancer.ServicePortName]bool, len(touched))
	var drop []int // prev's indices of touched rows
	var fresh []debugPort
	for _, name := range touched {
		if seen[name] {
			continue
		}
		seen[name] = true
		key := name.String()
		if i, found := slices.BinarySearchFunc(prev, key, func(r debugPort, k string) int { return strings.Compare(r.key, k) }); found {
			drop = append(drop, i)
		}
		if ap := p.active[name]; ap != nil {
			fresh = append(fresh, debugRow(name, ap))
		}
	}
	// One key can be touched under two names (an unnamed port that changed
	// protocol: the old name closed, the new one opened).
	drop = slices.Compact(slices.Sorted(slices.Values(drop)))
	slices.SortFunc(fresh, compareDebugRows)
	rows = make([]debugPort, 0, len(p.active))
	for i, r := range prev {
		if len(drop) > 0 && drop[0] == i {
			drop = drop[1:]
			continue
		}
		for len(fresh) > 0 && compareDebugRows(fresh[0], r) < 0 {
			rows, fresh = append(rows, fresh[0]), fresh[1:]
		}
		rows = append(rows, r)
	}
	rows = append(rows, fresh...)
	return rows, len(rows) == len(p.active)
}
