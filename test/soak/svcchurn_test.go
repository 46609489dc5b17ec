package soak

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/test/harness"
)

// The Service-churn group: beside the 50 stable Services (whose endpoints
// churn and whose clients are judged), Services that come and go under
// never-reused names, gain and lose ports, flip a port's protocol, get and
// lose node ports, ClientIP affinity and a faults annotation, each change a
// rewrite of its own manifest. A light probe asks their ports meanwhile (not
// judged: ports vanish under it), so their sockets, sessions, connections,
// affinity entries and faults hold state when they go. At the end they are
// all deleted and the proxy must be back to the footprint it had with the
// stable group alone.
//
// The group keeps its shape (churnedLive Services of churnedPorts ports)
// from its first steps to the end: a Service is replaced by one of a fresh
// name, a port by one of a fresh number, so the descriptors and goroutines
// its ports hold do not swing the slopes the stable group is judged by.

const (
	churnedLive     = 4
	churnedPorts    = 2
	churnEvery      = 400 * time.Millisecond
	churnedProbeGap = 100 * time.Millisecond
	nodePortBase    = 30000
	nodePorts       = 2000 // from nodePortBase, in the default range
	churnedIPs      = 250  // in 10.96.2.0/24
	maxDiffLines    = 40   // of a footprint's diff, in the failure and the report
)

// churned is one Service of the churn group as last written.
type churned struct {
	name     string // never reused
	ip       netip.Addr
	ports    []churnedPort
	nodePort bool // type NodePort (its ports hold node ports) or ClusterIP
	affinity bool
	faults   string // the faults annotation, "" for none
	nextPort int32  // port numbers are never reused within the Service
}

type churnedPort struct {
	name     string
	protocol v1.Protocol
	port     int32
	nodePort int32 // allocated while the Service is a NodePort one
}

// faultSets are the annotations the churn switches between: TCP and UDP
// latency, a TCP reset now and then, a throttled download. All but the first
// act on TCP only, which a Service without a TCP port refuses.
var faultSets = []string{
	`[{"name":"lat","type":"latency","toxicity":1.0,"attributes":{"latency":5,"jitter":2}}]`,
	`[{"name":"rst","type":"reset_peer","toxicity":0.3,"attributes":{"timeout":0}}]`,
	`[{"name":"bw","type":"bandwidth","stream":"downstream","toxicity":1.0,"attributes":{"rate":512}},{"name":"lat","type":"latency","toxicity":0.5,"attributes":{"latency":3,"jitter":0}}]`,
}

// svcChurn owns the churn group: its manifests in dir and what each op did.
type svcChurn struct {
	dir      string
	backends []netip.Addr
	rng      *rand.Rand

	mu      sync.Mutex
	live    []*churned
	created int // names handed out: c0000, c0001, ...
	// Addresses and node ports are handed out in turn, not lowest first:
	// one freed is not taken again at once, while the proxy may still
	// hold it for the Service that had it (a deleted manifest is kept
	// 0.5 s), which would make the new Service a conflicting one.
	usedIPs   map[netip.Addr]bool
	usedNodes map[int32]bool
	nextIP    int
	nextNode  int32
	ops       map[string]int // op name -> times done

	asked, answered atomic.Int64 // the probe's questions to churned ports
}

func newSvcChurn(dir string, backends []netip.Addr, seed uint64) *svcChurn {
	return &svcChurn{dir: dir, backends: backends, rng: rand.New(rand.NewPCG(seed, 0xc4a2)),
		usedIPs: map[netip.Addr]bool{}, usedNodes: map[int32]bool{}, ops: map[string]int{}}
}

// churnedIP is the churn group's k-th virtual address, beside the stable
// group's 10.96.1.0/24.
func churnedIP(k int) netip.Addr { return netip.AddrFrom4([4]byte{10, 96, 2, byte(1 + k)}) }

// step makes one change: it fills the group up to churnedLive Services,
// then replaces one Service (deleted, one of a fresh name created) or
// changes one Service one way.
func (s *svcChurn) step() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.live) < churnedLive {
		return s.create(v1.ProtocolTCP, v1.ProtocolUDP)
	}
	c := s.live[s.rng.IntN(len(s.live))]
	ops := []string{"replaced", "port replaced", "protocol flipped", "node ports toggled", "affinity toggled", "faults changed"}
	op := ops[s.rng.IntN(len(ops))]
	switch op {
	case "replaced":
		if err := s.delete(slices.Index(s.live, c)); err != nil {
			return err
		}
		var protos []v1.Protocol
		for _, p := range c.ports {
			protos = append(protos, p.protocol)
		}
		return s.create(protos...)
	case "port replaced":
		k := s.rng.IntN(len(c.ports))
		proto := c.ports[k].protocol
		delete(s.usedNodes, c.ports[k].nodePort)
		c.ports = slices.Delete(c.ports, k, k+1)
		s.addPort(c, proto)
	case "protocol flipped":
		// A TCP port becomes UDP and a UDP one (of any Service) TCP, in
		// one step: as many sockets of each kind as before.
		p := &c.ports[s.rng.IntN(len(c.ports))]
		other := s.portOf(func(q *churnedPort) bool { return q.protocol != p.protocol })
		p.protocol, other.port.protocol = other.port.protocol, p.protocol
		if other.svc != c {
			if err := s.write(other.svc); err != nil {
				return err
			}
		}
	case "node ports toggled":
		// One Service takes node ports and another gives them up, in one
		// step: as many claimed node ports as before.
		other := s.live[slices.IndexFunc(s.live, func(o *churned) bool { return o.nodePort != c.nodePort })]
		s.toggleNodePorts(other)
		s.toggleNodePorts(c)
		if err := s.write(other); err != nil {
			return err
		}
	case "affinity toggled":
		c.affinity = !c.affinity
	case "faults changed":
		sets := append([]string{""}, faultSets...)
		sets = slices.DeleteFunc(sets, func(f string) bool { return f == c.faults })
		c.faults = sets[s.rng.IntN(len(sets))]
	}
	s.ops[op]++
	return s.write(c)
}

// portOf is a live port that ok accepts and its Service; the group always
// holds one of each protocol and each kind of Service (see create).
func (s *svcChurn) portOf(ok func(*churnedPort) bool) (found struct {
	svc  *churned
	port *churnedPort
}) {
	for _, c := range s.live {
		for i := range c.ports {
			if ok(&c.ports[i]) {
				found.svc, found.port = c, &c.ports[i]
				return found
			}
		}
	}
	panic("svcChurn: no such port")
}

func (s *svcChurn) toggleNodePorts(c *churned) {
	c.nodePort = !c.nodePort
	for i := range c.ports {
		if c.nodePort {
			c.ports[i].nodePort = s.freeNodePort()
		} else {
			delete(s.usedNodes, c.ports[i].nodePort)
			c.ports[i].nodePort = 0
		}
	}
}

// create adds a Service of a fresh name with ports of protos (those of the
// one it replaces), a NodePort one while fewer than half the group are: the
// group's sockets and node port claims stay as many whatever the steps do.
func (s *svcChurn) create(protos ...v1.Protocol) error {
	for s.usedIPs[churnedIP(s.nextIP)] {
		s.nextIP = (s.nextIP + 1) % churnedIPs
	}
	c := &churned{name: fmt.Sprintf("c%04d", s.created), ip: churnedIP(s.nextIP), nextPort: 1000}
	s.nextIP = (s.nextIP + 1) % churnedIPs
	s.created++
	s.usedIPs[c.ip] = true
	c.nodePort = 2*len(slices.DeleteFunc(slices.Clone(s.live), func(o *churned) bool { return !o.nodePort })) < churnedLive
	for _, proto := range protos {
		s.addPort(c, proto)
	}
	c.affinity = s.rng.IntN(2) == 0
	if s.rng.IntN(2) == 0 {
		c.faults = faultSets[s.rng.IntN(len(faultSets))]
	}
	s.live = append(s.live, c)
	s.ops["created"]++
	return s.write(c)
}

func (s *svcChurn) delete(i int) error {
	c := s.live[i]
	s.live = slices.Delete(s.live, i, i+1)
	delete(s.usedIPs, c.ip)
	for _, p := range c.ports {
		delete(s.usedNodes, p.nodePort)
	}
	s.ops["deleted"]++
	return os.Remove(filepath.Join(s.dir, c.name+".yaml"))
}

// deleteAll removes every churned Service: the end of the run.
func (s *svcChurn) deleteAll() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for len(s.live) > 0 {
		if err := s.delete(len(s.live) - 1); err != nil {
			return err
		}
	}
	return nil
}

func (s *svcChurn) addPort(c *churned, proto v1.Protocol) {
	p := churnedPort{name: fmt.Sprintf("p%d", c.nextPort), protocol: proto, port: c.nextPort}
	c.nextPort++
	if c.nodePort {
		p.nodePort = s.freeNodePort()
	}
	c.ports = append(c.ports, p)
}

func (s *svcChurn) freeNodePort() int32 {
	for s.usedNodes[nodePortBase+s.nextNode] {
		s.nextNode = (s.nextNode + 1) % nodePorts
	}
	n := nodePortBase + s.nextNode
	s.nextNode = (s.nextNode + 1) % nodePorts
	s.usedNodes[n] = true
	return n
}

// target is a random live churned port for the probe; ok false when none.
func (s *svcChurn) target(rng *rand.Rand) (proto string, dst netip.AddrPort, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.live) == 0 {
		return "", netip.AddrPort{}, false
	}
	c := s.live[rng.IntN(len(s.live))]
	p := c.ports[rng.IntN(len(c.ports))]
	return strings.ToLower(string(p.protocol)), netip.AddrPortFrom(c.ip, uint16(p.port)), true
}

// probe asks churned ports from the pod1 addresses until ctx ends, one
// question per churnedProbeGap; answers are counted, not judged.
func (s *svcChurn) probe(ctx context.Context, l *load) {
	rng := rand.New(rand.NewPCG(7, 0xc4a2))
	for sleepCtx(ctx, churnedProbeGap) {
		proto, dst, ok := s.target(rng)
		if !ok {
			continue
		}
		cl := harness.Client{NS: l.c.Pod1, Src: l.c.Pod1IPs[rng.IntN(len(l.c.Pod1IPs))]}
		s.asked.Add(1)
		if _, err := cl.Ask(proto, dst, time.Second); err == nil {
			s.answered.Add(1)
		}
	}
}

// opCounts is ops as "name N" pairs, in a fixed order.
func (s *svcChurn) opCounts() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for _, op := range []string{"created", "deleted", "port replaced", "protocol flipped", "node ports toggled", "affinity toggled", "faults changed"} {
		out = append(out, fmt.Sprintf("%s %d", op, s.ops[op]))
	}
	return strings.Join(out, ", ")
}

// write renders c and its EndpointSlice (every port on both of the first
// two backends) into dir/NAME.yaml, atomically as writeManifest does.
func (s *svcChurn) write(c *churned) error {
	if c.faults != "" && c.faults != faultSets[0] && !slices.ContainsFunc(c.ports, func(p churnedPort) bool { return p.protocol == v1.ProtocolTCP }) {
		c.faults = faultSets[0] // the TCP toxics would make the manifest invalid
	}
	svc := &v1.Service{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Service"},
		ObjectMeta: metav1.ObjectMeta{Namespace: soakNamespace, Name: c.name},
		Spec: v1.ServiceSpec{
			Type:       v1.ServiceTypeClusterIP,
			ClusterIP:  c.ip.String(),
			ClusterIPs: []string{c.ip.String()},
		},
	}
	if c.nodePort {
		svc.Spec.Type = v1.ServiceTypeNodePort
	}
	if c.affinity {
		svc.Spec.SessionAffinity = v1.ServiceAffinityClientIP
	}
	if c.faults != "" {
		svc.Annotations = map[string]string{"kube-userspace-proxy/faults": c.faults}
	}
	ready := true
	port := int32(backendPort)
	slice := &discovery.EndpointSlice{
		TypeMeta: metav1.TypeMeta{APIVersion: "discovery.k8s.io/v1", Kind: "EndpointSlice"},
		ObjectMeta: metav1.ObjectMeta{Namespace: soakNamespace, Name: c.name + "-1",
			Labels: map[string]string{discovery.LabelServiceName: c.name}},
		AddressType: discovery.AddressTypeIPv4,
	}
	for _, p := range c.ports {
		svc.Spec.Ports = append(svc.Spec.Ports, v1.ServicePort{Name: p.name, Protocol: p.protocol, Port: p.port,
			NodePort: p.nodePort, TargetPort: intstr.FromInt32(backendPort)})
		slice.Ports = append(slice.Ports, discovery.EndpointPort{Name: &p.name, Protocol: &p.protocol, Port: &port})
	}
	for _, a := range s.backends[:2] {
		slice.Endpoints = append(slice.Endpoints, discovery.Endpoint{
			Addresses: []string{a.String()}, Conditions: discovery.EndpointConditions{Ready: &ready}})
	}
	var data []byte
	for i, obj := range []any{svc, slice} {
		b, err := yaml.Marshal(obj)
		if err != nil {
			return err
		}
		if i > 0 {
			data = append(data, "---\n"...)
		}
		data = append(data, b...)
	}
	tmp := filepath.Join(filepath.Dir(s.dir), "."+c.name+".yaml.tmp")
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(s.dir, c.name+".yaml"))
}

// footprint is what the proxy holds beyond its process: its iptables rules
// and its /metrics series. With only the stable group it is the same
// before and after the run, whatever the churn group did meanwhile.
type footprint struct {
	Rules   []string       // -A lines of the node's iptables-save (only the proxy writes rules there)
	Series  map[string]int // metric name -> series on /metrics
	Churned []string       // series naming a churned Service ("soak/cNNNN:")
}

func (f footprint) series() int {
	n := 0
	for _, k := range f.Series {
		n += k
	}
	return n
}

// takeFootprint reads the node's rules and the proxy's /metrics.
func (p probe) takeFootprint(iptablesSave func() (string, error)) (footprint, error) {
	f := footprint{Series: map[string]int{}}
	dump, err := iptablesSave()
	if err != nil {
		return f, err
	}
	for _, line := range strings.Split(dump, "\n") {
		if strings.HasPrefix(line, "-A ") {
			f.Rules = append(f.Rules, line)
		}
	}
	resp, err := p.client.Get(p.metrics)
	if err != nil {
		return f, err
	}
	defer resp.Body.Close()
	body := new(strings.Builder)
	if _, err := io.Copy(body, resp.Body); err != nil {
		return f, err
	}
	for _, line := range strings.Split(body.String(), "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name, _, _ := strings.Cut(line, "{")
		name, _, _ = strings.Cut(name, " ")
		f.Series[name]++
		if strings.Contains(line, `="`+soakNamespace+`/c`) {
			f.Churned = append(f.Churned, line)
		}
	}
	return f, nil
}

// diff says how after differs from before: rules gained or lost, metrics
// whose series count changed, series naming churned Services; "" if none.
func (f footprint) diff(after footprint) string {
	var out []string
	for _, r := range after.Rules {
		if !slices.Contains(f.Rules, r) {
			out = append(out, "rule gained: "+r)
		}
	}
	for _, r := range f.Rules {
		if !slices.Contains(after.Rules, r) {
			out = append(out, "rule lost: "+r)
		}
	}
	var names []string
	for n := range f.Series {
		names = append(names, n)
	}
	for n := range after.Series {
		if _, ok := f.Series[n]; !ok {
			names = append(names, n)
		}
	}
	slices.Sort(names)
	for _, n := range names {
		if f.Series[n] != after.Series[n] {
			out = append(out, fmt.Sprintf("%s: %d series, before %d", n, after.Series[n], f.Series[n]))
		}
	}
	for _, l := range after.Churned {
		out = append(out, "series of a deleted Service: "+l)
	}
	if len(out) > maxDiffLines {
		out = append(out[:maxDiffLines], fmt.Sprintf("... and %d more", len(out)-maxDiffLines))
	}
	return strings.Join(out, "\n")
}
