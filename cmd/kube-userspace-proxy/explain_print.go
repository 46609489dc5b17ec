package main

import (
	"bufio"
	"fmt"
	"io"
	"maps"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/faults"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/iptables"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/proxier"
)

// explanation is what explain prints: the plan's service ports and, per IP
// family, the portals rendered by the real iptables renderer.
type explanation struct {
	source  string
	bind    netip.Addr
	nodeIPs []netip.Addr // each family's
	// redirect names the families whose portals have no node IP to DNAT
	// to, and REDIRECT instead.
	redirect []string
	// preroutingRedirect: --prerouting-redirect, pods' and other hosts'
	// traffic is REDIRECTed whatever the node IP.
	preroutingRedirect bool
	portRange          string
	kernelPorts        bool
	ports              []proxier.DebugServicePort
	families           []familyRules
	// invalid counts the source's problems: objects, documents or files
	// left out.
	invalid int
	// warnings are the plan's, per Service (namespace/name).
	warnings map[string][]string
	// sliceless are the Services (namespace/name) no IPv4 or IPv6
	// EndpointSlice names, with the FQDN slices that do.
	sliceless map[string][]string
	// policies are the plan's, per service port: which traffic policies
	// are Local.
	policies map[string]proxier.LocalPolicy
	// unserved is the family a one-address --bind-address leaves without
	// portals ("IPv4", "IPv6"; "" when both are served).
	unserved string
	// noRules: --iptables=false, the proxy serves its sockets and nothing
	// sends service traffic to them.
	noRules bool
	// zone is the zone of the Node explained (node), whose topology hints
	// decide the endpoints; "" when there is none (manifests, no Node, no
	// zone label).
	zone, node string
	// fromAPIServer: the Services come from an API server, where the node
	// IP's default is the Node object's address (nodeips.go).
	fromAPIServer bool
}

type familyRules struct {
	name    string
	rules   *iptables.Rules
	portals []iptables.Portal
	full    []byte // the rendering of every portal, once needed
}

func (e *explanation) write(out io.Writer) error {
	w := bufio.NewWriter(out)
	fmt.Fprintf(w, "What kube-userspace-proxy would do with the Services in %s.\n", e.source)
	fmt.Fprintln(w, "Nothing was changed: explain opens no socket and installs no rule.")
	switch {
	case e.invalid == 1:
		fmt.Fprintln(w, "1 manifest object was invalid and is left out, as the proxy would leave it out (the error is on stderr).")
	case e.invalid > 1:
		fmt.Fprintf(w, "%d manifest objects were invalid and are left out, as the proxy would leave them out (the errors are on stderr).\n", e.invalid)
	}
	fmt.Fprintln(w)
	if e.noRules {
		fmt.Fprintf(w, "--iptables=false: no rules would be installed, so traffic to service addresses and node\n"+
			"ports is not caught; clients reach a service port only at its proxy socket, listening\n"+
			"on %s (--bind-address).\n", e.bind)
	} else if e.bind.IsValid() && !e.bind.IsUnspecified() {
		fmt.Fprintf(w, "Proxy sockets listen on %s (--bind-address); rules send service traffic there.\n", e.bind)
		if e.unserved != "" {
			// As the proxy logs it at start.
			fmt.Fprintf(w, "--bind-address names one address: the other family's (%s) Services get no portals; dual-stack\n"+
				"ones are served in %s only.\n", e.unserved, e.served())
		}
	} else {
		fmt.Fprintf(w, "Proxy sockets listen on every address (--bind-address %s).\n", e.bind)
		// A link-local node IP is no DNAT target (iptables.LinkScoped).
		dnat := slices.DeleteFunc(slices.Clone(e.nodeIPs), iptables.LinkScoped)
		// Where the proxy takes the node IP from when --node-ip is not
		// given (nodeips.go): the Node object's with an API server.
		one, both := "the address of the interface holding the default route", "those of the interfaces holding the default routes"
		if e.fromAPIServer {
			one, both = "its Node object's address, else the address of the interface\nholding the default route", "its Node object's, else those of the interfaces\nholding the default routes"
		}
		switch len(dnat) {
		case 1:
			fmt.Fprintf(w, "Traffic this node sends to a Service is sent to %s, the node's address\n(--node-ip; by default %s).\n", dnat[0], one)
		case 2:
			fmt.Fprintf(w, "Traffic this node sends to a Service is sent to %s (IPv4) or %s (IPv6),\nthe node's addresses (--node-ip; by default %s).\n", dnat[0], dnat[1], both)
		}
		for _, ip := range e.nodeIPs {
			if iptables.LinkScoped(ip) {
				// As the proxy logs it at start (iptables.Rules.containerTarget, hostTarget).
				fmt.Fprintf(w, "The IPv6 node IP %s is link-local: traffic from pods and other hosts is REDIRECTed to\n"+
					"the address it arrived on, the node's own to the loopback address (a DNAT to a link-local\n"+
					"address reaches its own link only).\n", ip)
			}
		}
		if len(e.redirect) > 0 {
			// The rules turned into REDIRECT without a word, and the
			// node-IP sentence above went missing.
			fmt.Fprintf(w, "No %s default route and no --node-ip: portals fall back to REDIRECT (README, \"iptables\n"+
				"rules\"): traffic from pods and other hosts goes to the address it arrived on, the node's\n"+
				"own to the loopback address.\n", strings.Join(e.redirect, " or "))
		}
	}
	users := "the rules"
	if e.noRules {
		users = "clients"
	}
	if e.kernelPorts {
		fmt.Fprintf(w, "Proxy port numbers are examples: at start each service port gets a free port outside\n"+
			"the kernel's ephemeral range (choose a range with --proxy-port-range); %s then\n"+
			"use those numbers.\n", users)
	} else {
		fmt.Fprintf(w, "Proxy port numbers are examples: at start each service port gets a free port of\n"+
			"--proxy-port-range %s, picked at random; %s then use those numbers.\n", e.portRange, users)
	}
	if e.zone != "" {
		fmt.Fprintf(w, "Endpoints follow topology hints for zone %s, the topology.kubernetes.io/zone of Node %s.\n", e.zone, e.node)
	}
	if !e.noRules {
		fmt.Fprintln(w, "Each rule is shown after a line (#) saying which traffic it catches.")
	}
	// A Service whose every port is skipped (SCTP) has no section of its
	// own: its warnings get one.
	explained := map[string]bool{}
	for _, p := range e.ports {
		explained[serviceOf(p.ServicePort)] = true
	}
	for _, svc := range slices.Sorted(maps.Keys(e.warnings)) {
		if !explained[svc] {
			fmt.Fprintln(w)
			fmt.Fprintf(w, "== %s (no service port to proxy) ==\n", svc)
			writeWarnings(w, e.warnings[svc])
		}
	}
	if len(e.ports) == 0 {
		fmt.Fprintln(w)
		fmt.Fprintln(w, "No service port to proxy: no Service with a cluster IP, external IP or node port was found.")
		return w.Flush()
	}
	for _, p := range e.ports {
		fmt.Fprintln(w)
		e.writePort(w, p)
	}
	for _, f := range e.families {
		if len(f.portals) == 0 {
			continue
		}
		fmt.Fprintln(w)
		restore := "iptables-restore"
		if f.name == "IPv6" {
			restore = "ip6tables-restore"
		}
		fmt.Fprintf(w, "== All %s rules as %s input (%s --noflush makes our chains hold exactly these) ==\n", f.name, restore, restore)
		writeWithJumps(w, f.rules.Render(f.portals), f.rules.FirstStartJumps())
	}
	return w.Flush()
}

// writeWithJumps writes a rendering of our chains with, before each
// table's COMMIT, the jumps from the built-in chains into them as comment
// lines: uncommented they would be added again each time the input is
// restored, where the proxy adds each one once, where it is missing.
func writeWithJumps(w *bufio.Writer, rendered []byte, jumps map[iptables.Table][]string) {
	var table iptables.Table
	for _, line := range strings.SplitAfter(string(rendered), "\n") {
		if name, ok := strings.CutPrefix(line, "*"); ok {
			table = iptables.Table(strings.TrimSpace(name))
		}
		if line == "COMMIT\n" && len(jumps[table]) > 0 {
			fmt.Fprintln(w, "# The jumps into these chains, commented out: the proxy adds each one to its built-in")
			fmt.Fprintln(w, "# chain where it is missing (a first start with these lines, later ones with iptables")
			fmt.Fprintln(w, "# -I/-A), and never twice; restored as lines, they would be added again each time.")
			for _, jump := range jumps[table] {
				fmt.Fprintln(w, "# "+jump)
			}
		}
		_, _ = w.WriteString(line)
	}
}

func (e *explanation) writePort(w *bufio.Writer, p proxier.DebugServicePort) {
	fmt.Fprintf(w, "== %s (%s) ==\n", p.ServicePort, p.Protocol)
	var addrs, unserved []string
	for _, ip := range p.ServiceIPs {
		addr := net.JoinHostPort(ip, strconv.Itoa(p.Port))
		if v4, _ := families([]string{ip}); e.unserved != "" && v4 == (e.unserved == "IPv4") {
			unserved = append(unserved, addr)
		} else {
			addrs = append(addrs, addr)
		}
	}
	if p.NodePort != 0 {
		nodeAddrs := "the node's addresses"
		if e.unserved != "" {
			nodeAddrs = "the node's " + e.served() + " addresses"
		}
		addrs = append(addrs, fmt.Sprintf("port %d of %s (NodePort)", p.NodePort, nodeAddrs))
	}
	field(w, "service address", strings.Join(addrs, ", "))
	if len(unserved) > 0 {
		field(w, "not served", fmt.Sprintf("%s (%s, which --bind-address %s does not serve: no rule)", strings.Join(unserved, ", "), e.unserved, e.bind))
	}
	if p.Error != "" {
		// The plan found no port for it (a --proxy-port-range too small):
		// a running proxy would not serve it, and retry.
		field(w, "proxy socket", "none: "+p.Error+"; a running proxy would not serve this port, and would retry")
	} else if e.noRules {
		field(w, "proxy socket", p.ProxyAddress+" (example port): where clients connect, no rule leads here")
	} else {
		field(w, "proxy socket", p.ProxyAddress+" (example port)")
	}
	policy := e.policies[p.ServicePort]
	e.writeEndpoints(w, p, policy)
	if p.ExternalProxyAddress != "" {
		e.writeExternal(w, p, policy)
	}
	if p.Affinity == "ClientIP" {
		field(w, "session affinity", fmt.Sprintf("ClientIP: a client keeps the endpoint it got until %s pass without a new connection (UDP: session) from it", time.Duration(p.TimeoutSec)*time.Second))
	} else {
		field(w, "session affinity", "none")
	}
	switch {
	case p.FaultsError != "" && len(p.Faults) == 0:
		// From an API server, which stores any annotation: "none" alone
		// read as a Service that declares none.
		field(w, "faults", "none: the annotation is invalid ("+p.FaultsError+"); a running proxy keeps the Service's last valid faults, and a new Service gets none")
	case len(p.Faults) == 0:
		field(w, "faults", "none")
	default:
		var fs []string
		for _, t := range p.Faults {
			fs = append(fs, toxicSummary(t.Toxic))
		}
		field(w, "faults", strings.Join(fs, "; "))
	}
	writeWarnings(w, e.warnings[serviceOf(p.ServicePort)])
	if e.noRules {
		field(w, "rules", "none (--iptables=false)")
		return
	}
	e.writeRules(w, p)
}

// writeEndpoints writes the port's endpoints line: none and why, or the
// list, its order and how its families serve which clients.
func (e *explanation) writeEndpoints(w *bufio.Writer, p proxier.DebugServicePort, policy proxier.LocalPolicy) {
	// The proxy socket's endpoints are this node's own when the policy
	// its traffic follows is Local: internal, and external clients' too
	// when both are (with one Local alone, external traffic has a socket
	// of its own; with both, the node's and pods' traffic to external
	// addresses has).
	localOnly := ""
	switch {
	case policy.Internal && policy.External:
		localOnly = "internalTrafficPolicy and externalTrafficPolicy Local send cluster IP traffic and other hosts' NodePort, external and LoadBalancer IP traffic"
	case policy.Internal:
		localOnly = "internalTrafficPolicy Local sends cluster IP traffic"
	}
	refusal := refusalOf(p.Protocol)
	if p.Error != "" {
		field(w, "endpoints", "not used while the port has no proxy socket")
	} else if len(p.Endpoints) == 0 && localOnly != "" {
		// Not "none ready": other nodes may have ready ones, which this
		// node's clients do not get.
		fieldWrapped(w, "endpoints", "none on this node: "+localOnly+" to this node's endpoints only, so "+refusal+" (other nodes' are not used for it)")
	} else if fqdn, ok := e.sliceless[serviceOf(p.ServicePort)]; len(p.Endpoints) == 0 && ok {
		// Not "none ready": no slice names the Service (its warning says
		// what must), so there is no endpoint to be ready.
		if len(fqdn) > 0 {
			fieldWrapped(w, "endpoints", "none: only FQDN EndpointSlices name the Service, which give no endpoint; "+refusal+" until an IPv4 or IPv6 one does")
		} else {
			field(w, "endpoints", "none: no EndpointSlice names the Service; "+refusal+" until one does")
		}
	} else if len(p.Endpoints) == 0 {
		field(w, "endpoints", "none ready: "+refusal+" until one is")
	} else {
		field(w, "endpoints", strings.Join(p.Endpoints, ", "))
		switch {
		case policy.Internal && policy.External:
			field(w, "", "this node's own only: internalTrafficPolicy and externalTrafficPolicy Local")
		case policy.Internal:
			field(w, "", "this node's own only: internalTrafficPolicy Local")
		}
		field(w, "", "round robin: each new connection (UDP: each new client address) takes the next one")
		field(w, "", "in this order; a running proxy shuffles the list once when it changes")
		if s4, s6 := families(p.ServiceIPs); s4 && s6 && e.unserved != "" {
			// Dual-stack, one family served: its clients alone, by its
			// endpoints alone (the other family's slices give the
			// Service none on such a node, as kube-proxy runs no
			// proxier of that family there).
			e4, e6 := families(p.Endpoints)
			eServed := e4
			if e.unserved == "IPv4" {
				eServed = e6
			}
			served := "an " + e.served() + " client is refused (no " + e.served() + " endpoint)"
			if eServed {
				served = e.served() + " clients take the " + e.served() + " ones"
			}
			field(w, "", served+"; the Service's "+e.unserved+" endpoints are not used ("+e.unserved+" is not served)")
		} else if s4 && s6 {
			// Dual-stack: each family's clients are served by its own
			// endpoints, or refused without one.
			switch e4, e6 := families(p.Endpoints); {
			case e4 && e6:
				field(w, "", "each family apart: IPv4 clients take the IPv4 ones, IPv6 clients the IPv6 ones")
			case e4:
				field(w, "", "IPv4 clients only: an IPv6 client is refused (no IPv6 endpoint)")
			default:
				field(w, "", "IPv6 clients only: an IPv4 client is refused (no IPv4 endpoint)")
			}
		}
	}
}

// writeRules writes the port's rules in each family, each after a comment
// saying what it catches.
func (e *explanation) writeRules(w *bufio.Writer, p proxier.DebugServicePort) {
	fmt.Fprintln(w, "rules:")
	for i := range e.families {
		f := &e.families[i]
		var mine []iptables.Portal
		for _, portal := range f.portals {
			if portal.Name == p.ServicePort {
				mine = append(mine, portal)
			}
		}
		if len(mine) == 0 {
			continue
		}
		for _, line := range strings.Split(string(f.rules.Render(mine)), "\n") {
			if !strings.HasPrefix(line, "-A ") {
				continue
			}
			chain, rule, _ := strings.Cut(line[len("-A "):], " ")
			grouping := chain == iptables.ChainProxyPortGuard || chain == iptables.ChainPortalsNonLocal || chain == iptables.ChainProxyPortReject
			if proto, ports, _, ok := iptables.GuardRulePorts(rule); ok && grouping && len(ports) == 1 {
				// Past 256 proxy ports these chains group them by blocks
				// of 16: show the rule of the family's rendering that
				// covers this port.
				if f.full == nil {
					f.full = f.rules.Render(f.portals)
				}
				if grouped := iptables.GuardRuleCovering(f.full, chain, proto, ports[0]); grouped != "" {
					line = grouped
				}
			}
			fmt.Fprintf(w, "  # %s\n  %s\n", iptables.Describe(line), line)
		}
	}
}

// refusalOf says what a client of a port without endpoints gets.
func refusalOf(protocol string) string {
	if protocol == "UDP" {
		return "a UDP client's datagram is answered with ICMP port unreachable"
	}
	return "a TCP client's connection is reset"
}

// served is the family a one-address --bind-address serves.
func (e *explanation) served() string {
	if e.unserved == "IPv4" {
		return "IPv6"
	}
	return "IPv4"
}

// writeExternal prints a port's external socket, which either traffic
// policy being Local gives it: under externalTrafficPolicy Local alone it
// holds this node's endpoints, under internalTrafficPolicy Local (the
// proxy socket's being this node's) every node's, for external traffic
// under externalTrafficPolicy Cluster, for the node's and pods' traffic to
// external addresses under Local (kube-proxy's shortcut).
func (e *explanation) writeExternal(w *bufio.Writer, p proxier.DebugServicePort, policy proxier.LocalPolicy) {
	socket := p.ExternalProxyAddress + " (example port): "
	switch {
	case e.noRules && policy.Internal && policy.External:
		fieldWrapped(w, "external socket", socket+"both traffic policies Local; no rule leads here")
	case policy.Internal && policy.External:
		fieldWrapped(w, "external socket", socket+"this node's own traffic to NodePorts, external and LoadBalancer IPs "+
			"(and its pods', with --cluster-cidr) comes here, to every node's endpoints, as kube-proxy's "+
			"(both traffic policies Local: other hosts' stays on this node's, with cluster IP traffic)")
	case e.noRules && policy.Internal:
		fieldWrapped(w, "external socket", socket+"internalTrafficPolicy Local, externalTrafficPolicy Cluster; no rule leads here")
	case e.noRules:
		field(w, "external socket", socket+"externalTrafficPolicy Local; no rule leads here")
	case policy.Internal:
		fieldWrapped(w, "external socket", socket+"NodePort, external and LoadBalancer IP traffic from other hosts "+
			"comes here, to every node's endpoints (externalTrafficPolicy Cluster; only cluster IP traffic "+
			"stays on this node's, by internalTrafficPolicy Local)")
	default:
		field(w, "external socket", socket+"externalTrafficPolicy Local; NodePort, external")
		field(w, "", "and LoadBalancer IP traffic from other hosts comes here")
	}
	switch {
	case policy.Internal && len(p.ExternalEndpoints) == 0:
		field(w, "all endpoints", "none ready: "+refusalOf(p.Protocol)+" until one is")
	case policy.Internal:
		field(w, "all endpoints", strings.Join(p.ExternalEndpoints, ", ")+" (every node's)")
	case len(p.ExternalEndpoints) == 0 && policy.HealthCheckNodePort != 0:
		field(w, "local endpoints", "none on this node: external clients are refused here (the Service's")
		field(w, "", fmt.Sprintf("healthCheckNodePort %d tells a load balancer to send them to nodes that have one)", policy.HealthCheckNodePort))
	case len(p.ExternalEndpoints) == 0:
		// A NodePort Service has no healthCheckNodePort (nor has a
		// manifests LoadBalancer that names none).
		field(w, "local endpoints", "none on this node: external clients are refused here (a client must")
		field(w, "", "pick a node that has one: the Service has no healthCheckNodePort)")
	default:
		field(w, "local endpoints", strings.Join(p.ExternalEndpoints, ", ")+" (this node's own)")
	}
}

// writeWarnings prints a Service's warnings, one a line.
func writeWarnings(w *bufio.Writer, warnings []string) {
	for i, warning := range warnings {
		name := "warnings"
		if i > 0 {
			name = ""
		}
		field(w, name, warning)
	}
}

// serviceOf is the namespace/name of a service port's name.
func serviceOf(servicePort string) string {
	svc, _, _ := strings.Cut(servicePort, ":")
	return svc
}

// field prints one "name: value" line of a service port, values aligned.
func field(w *bufio.Writer, name, value string) {
	label := ""
	if name != "" {
		label = name + ":"
	}
	fmt.Fprintf(w, "%-18s%s\n", label, value)
}

// fieldWrapped prints a field whose value is a sentence, wrapped at
// word boundaries so no line's value passes 80 characters.
func fieldWrapped(w *bufio.Writer, name, value string) {
	line := ""
	for _, word := range strings.Fields(value) {
		if line != "" && len(line)+1+len(word) > 80 {
			field(w, name, line)
			name, line = "", ""
		}
		if line != "" {
			line += " "
		}
		line += word
	}
	field(w, name, line)
}

// families reports which families addrs (IPs, or ip:port) hold.
func families(addrs []string) (v4, v6 bool) {
	for _, a := range addrs {
		ip, err := netip.ParseAddr(a)
		if err != nil {
			ap, err := netip.ParseAddrPort(a)
			if err != nil {
				continue
			}
			ip = ap.Addr()
		}
		v4, v6 = v4 || ip.Unmap().Is4(), v6 || ip.Unmap().Is6()
	}
	return v4, v6
}

// toxicSummary is one toxic as explain shows it: what it does (its
// attributes) and to whom (clients, and its own seed, which replaces
// --fault-seed in its draws), which the name and type alone hid (a toxic
// for 10.0.0.0/8 read as one for every client).
func toxicSummary(t faults.Toxic) string {
	var attrs []string
	for _, k := range slices.Sorted(maps.Keys(t.Attributes)) {
		attrs = append(attrs, fmt.Sprintf("%s=%g", k, t.Attributes[k]))
	}
	out := fmt.Sprintf("%s (%s, %s, toxicity %g", t.Name, t.Type, t.Stream, t.Toxicity)
	if t.Seed != nil {
		out += fmt.Sprintf(", seed %d", *t.Seed)
	}
	if len(attrs) > 0 {
		out += ", " + strings.Join(attrs, " ")
	}
	if len(t.Clients) > 0 {
		out += ", clients " + strings.Join(t.Clients, " ")
	}
	return out + ")"
}
