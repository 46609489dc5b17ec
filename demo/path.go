package demo

import (
	"context"
	"fmt"
	"io"
	"net/netip"
	"strings"
)

// packetPath is one real request of the run, traced through the stations a
// packet passes on its way to a Service's backend: the client, the portal
// rule that sends the Service's address to the proxy (iptables, as root),
// the proxy socket, the balancer, the backend.
type packetPath struct {
	ClientName  string         // "client 1"
	Client      netip.AddrPort // the client's address and source port
	Where       string         // where the client runs, "" on this machine
	Dialed      netip.AddrPort // what the client connected to
	ClusterIP   netip.AddrPort // the Service's ClusterIP and port
	Rule        string         // the portal rule as iptables-save prints it; "" when none is installed
	Socket      netip.AddrPort // the proxy socket
	ServicePort string         // "default/web:http"
	Affinity    string         // "none", "client IP, 10800 s"
	Endpoints   []string       // the backends the balancer takes in turn
	Backend     string         // the one it picked
	BackendAddr netip.AddrPort
	Answer      string // what the backend answered
}

// pathLabel is the width of the station names' column.
const pathLabel = 14

// render draws the path top to bottom, each station with the real address
// of this run, the text wrapped to width.
func (p packetPath) render(w io.Writer, width int) {
	text := width - 2 - pathLabel
	station := func(name string, lines ...string) {
		first := true
		for _, l := range lines {
			for _, part := range wrap(l, text) {
				label := ""
				if first {
					label = name
				}
				lead := "  " + label + strings.Repeat(" ", pathLabel-len(label))
				if !first && name != "backend" {
					lead = "     │" + strings.Repeat(" ", pathLabel-4)
				}
				fmt.Fprintln(w, strings.TrimRight(lead+part, " "))
				first = false
			}
		}
		if name != "backend" {
			fmt.Fprintln(w, "     ▼")
		}
	}
	who := p.Client.String()
	if p.Where != "" {
		who += " (" + p.Where + ")"
	}
	if p.Rule == "" {
		station(p.ClientName, who, fmt.Sprintf("connects to %s, the proxy socket itself", p.Dialed))
		station("portal rule",
			fmt.Sprintf("none here: without root no rule sends the Service's address %s (its ClusterIP) to the proxy socket.", p.ClusterIP),
			"As root, an iptables rule does: see demo --netns.")
	} else {
		station(p.ClientName, who, fmt.Sprintf("connects to %s, the Service's ClusterIP", p.Dialed))
		station("portal rule", "this iptables rule rewrites the destination to the proxy socket:", p.Rule)
	}
	station("proxy socket", p.Socket.String(), fmt.Sprintf("opened by kube-userspace-proxy for %s, accepts the connection", p.ServicePort))
	station("balancer", fmt.Sprintf("takes %s in turn (affinity: %s)", strings.Join(p.Endpoints, ", "), p.Affinity),
		"picks "+p.Backend)
	station("backend", fmt.Sprintf("%s at %s answers %q;", p.Backend, p.BackendAddr, p.Answer),
		"the proxy copies the bytes both ways until the connection closes")
}

// tracePath makes one request from client 1 to the plain Service and
// describes its path with the addresses it really took. rule finds the
// portal rule for a ClusterIP and port ("" without portals).
func (l *lab) tracePath(ctx context.Context, rule func(netip.AddrPort) string) (packetPath, error) {
	s, ok := l.service(webServicePort)
	if !ok {
		return packetPath{}, fmt.Errorf("%s is not served", webServicePort)
	}
	socket, err := l.socketAddr(webServicePort)
	if err != nil {
		return packetPath{}, err
	}
	cluster, err := l.clusterAddr(webServicePort)
	if err != nil {
		return packetPath{}, err
	}
	dialed, err := l.proxyAddr(webServicePort)
	if err != nil {
		return packetPath{}, err
	}
	name, local, err := accessTCPFrom(ctx, l.cn, dialed, l.addr(cli1))
	if err != nil {
		return packetPath{}, err
	}
	p := packetPath{
		ClientName:  "client 1",
		Client:      local,
		Where:       l.clientWhere,
		Dialed:      dialed,
		ClusterIP:   cluster,
		Socket:      socket,
		ServicePort: webServicePort,
		Affinity:    affinityWords(s),
		Backend:     name,
		Answer:      name,
	}
	if rule != nil {
		p.Rule = rule(cluster)
	}
	for _, ep := range s.Endpoints {
		p.Endpoints = append(p.Endpoints, l.nameOf(webServicePort, ep))
	}
	for _, b := range l.backends {
		if b.Name == name {
			p.BackendAddr = b.TCPAddr()
		}
	}
	return p, nil
}
