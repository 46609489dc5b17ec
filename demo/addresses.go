package demo

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
)

// intro tells the user what runs where before the table starts.
func (l *lab) intro(w io.Writer, args []string) {
	fmt.Fprintln(w, "kube-userspace-proxy demo: Kubernetes Services on loopback, no cluster, no root.")
	fmt.Fprintln(w, "Seed 000 measured ClientIP session affinity on a real cluster; the same experiments run here.")
	fmt.Fprintln(w)
	for i, b := range l.backends {
		label := ""
		if i == 0 {
			label = "backends"
		}
		fmt.Fprintf(w, "%-10s %s  tcp %s  udp %s (answer with their name)\n", label, b.Name, b.TCPAddr(), b.UDPAddr())
	}
	fmt.Fprintf(w, "%-10s kube-userspace-proxy %s  (in-process)\n", "proxier", shellJoin(args))
	l.printServices(w, "services", "")
	fmt.Fprintf(w, "%-10s cli1 = %s, cli2 = %s: the proxy keys affinity on the client IP;\n", "clients", cli1, cli2)
	fmt.Fprintf(w, "%-10s timing trials from %s-%d, %s-%d and %s\n\n", "", shortClient(0), 20+trialCount,
		longClient(0), 40+trialCount, refreshClient)
}

// printServices lists each service port: its proxy address, its affinity,
// its backends and, with hints, a command to try it with.
func (l *lab) printServices(w io.Writer, label string, hintIndent string) {
	for _, s := range l.p.DebugServices() {
		affinity := s.Affinity
		if s.TimeoutSec > 0 {
			affinity = fmt.Sprintf("%s %ds", affinity, s.TimeoutSec)
		}
		var eps []string
		for _, ep := range s.Endpoints {
			eps = append(eps, l.nameOf(s.ServicePort, ep))
		}
		slices.Sort(eps)
		fmt.Fprintf(w, "%-10s %-24s %s %-16s %-16s → %s\n", label, s.ServicePort, strings.ToLower(s.Protocol),
			s.ProxyAddress, affinity, strings.Join(eps, ", "))
		label = ""
		if hintIndent == "" {
			continue
		}
		host, port := splitProxyAddress(s.ProxyAddress)
		if s.Protocol == "UDP" {
			fmt.Fprintf(w, "%s try: %s\n", hintIndent, tryUDP(host, port))
		} else {
			fmt.Fprintf(w, "%s try: %s\n", hintIndent, tryTCP(host, port))
			fmt.Fprintf(w, "%s      (with iptables portals on, as root: the ClusterIP %s:%d)\n", hintIndent,
				strings.Join(s.ServiceIPs, ","), s.Port)
		}
	}
}

func splitProxyAddress(a string) (host, port string) {
	i := strings.LastIndex(a, ":")
	if i < 0 {
		return a, ""
	}
	return a[:i], a[i+1:]
}

// serve puts the example back as it started (all three backends, no
// faults), prints where to reach everything and waits for Ctrl-C.
func (l *lab) serve(ctx context.Context, w io.Writer, metricsAddr string) error {
	if _, err := l.setStickyBackends(ctx, l.backends); err != nil {
		return err
	}
	if _, err := l.setWebFaults(ctx, "", nil); err != nil {
		return err
	}
	fmt.Fprintln(w, "\nServing until Ctrl-C. Every service port, its proxy socket and its backends:")
	l.printServices(w, "", "          ")
	fmt.Fprintf(w, "\nThe proxier's view:  curl -s http://%s/debug/services   (and /metrics)\n", metricsAddr)
	fmt.Fprintf(w, "The manifests:       %s\n", l.manifests.dir)
	fmt.Fprintln(w, "                     edit them (timeoutSeconds, endpoints, the kube-userspace-proxy/faults")
	fmt.Fprintln(w, "                     annotation of the fault section...) and the change is live within 1 s.")
	<-ctx.Done()
	fmt.Fprintln(w, "\nStopping: proxy sockets, backends and the manifest directory are removed.")
	return nil
}
