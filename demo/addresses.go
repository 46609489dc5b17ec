package demo

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/proxier"
)

// intro tells the user what runs where before anything is measured.
func (l *lab) intro(w io.Writer, width int, args []string, where setting) {
	fmt.Fprintf(w, "kube-userspace-proxy demo: how a Kubernetes Service shares connections among\nits pods, %s.\n\n", where.headline)
	paragraph(w, width, fmt.Sprintf("A Service is one stable address in front of several copies of a program (pods). Here three small servers stand in for the pods%s; each answers with its name:", where.backends))
	list := textTable{width: width, indent: "  "}
	for _, b := range l.backends {
		list.rows = append(list.rows, tableRow{cells: []string{b.Name, "TCP " + b.TCPAddr().String(), "UDP " + b.UDPAddr().String()}})
	}
	list.render(w)
	fmt.Fprintln(w)
	paragraph(w, width, fmt.Sprintf("The proxy runs %s, started as this command line would start it:", where.proxy))
	for _, l := range wrap("kube-userspace-proxy "+shellJoin(args), width-4) {
		fmt.Fprintln(w, "  "+l)
	}
	fmt.Fprintln(w)
	paragraph(w, width, "It reads three Services from that directory's manifests, each in front of all three pods, and opens a proxy socket for each:")
	l.printServices(w, width, "  ")
	fmt.Fprintln(w)
	paragraph(w, width, fmt.Sprintf("The clients have addresses of their own%s: client 1 is %s, client 2 is %s; the timing experiments use %s to %s, %s to %s and %s. The proxy tells clients apart by their IP address.",
		where.clients, l.addr(cli1), l.addr(cli2),
		l.addr(shortClient(0)), l.addr(shortClient(trialCount-1)), l.addr(longClient(0)), l.addr(longClient(trialCount-1)), l.addr(refreshClient)))
	fmt.Fprintln(w)
}

// paragraph prints text wrapped to width, at most 80 columns for reading.
func paragraph(w io.Writer, width int, text string) {
	for _, l := range wrap(text, min(width, 80)) {
		fmt.Fprintln(w, l)
	}
}

// setting is how the intro describes where things run.
type setting struct {
	headline, backends, proxy, clients string
}

var onLoopback = setting{
	headline: "on this machine's loopback (no cluster, no root)",
	proxy:    "in this process",
}

// affinityWords says a service port's session affinity in plain words.
func affinityWords(s proxier.DebugServicePort) string {
	if s.Affinity != "ClientIP" {
		return "none"
	}
	return fmt.Sprintf("client IP, %d s", s.TimeoutSec)
}

// printServices lists each service port: its ClusterIP, its proxy socket,
// its affinity and, when they are not all three, its backends.
func (l *lab) printServices(w io.Writer, width int, indent string) {
	list := textTable{width: width, indent: indent, titles: []string{"Service:port", "ClusterIP", "proxy socket", "affinity"}}
	for _, s := range l.p.DebugServices() {
		var eps []string
		for _, ep := range s.Endpoints {
			eps = append(eps, l.nameOf(s.ServicePort, ep))
		}
		slices.Sort(eps)
		cluster := strings.Join(s.ServiceIPs, ",")
		if len(s.ServiceIPs) > 0 {
			cluster = fmt.Sprintf("%s:%d", cluster, s.Port)
		}
		r := tableRow{cells: []string{s.ServicePort, strings.ToUpper(s.Protocol) + " " + cluster, s.ProxyAddress, affinityWords(s)}}
		if len(eps) != len(l.backends) {
			r.notes = []string{"only " + strings.Join(eps, ", ")}
		}
		list.rows = append(list.rows, r)
	}
	list.render(w)
}

// printHints prints, per service port, a command that reaches it. Commands
// are never wrapped: a line break would stop them working when pasted.
func (l *lab) printHints(w io.Writer) {
	for _, s := range l.p.DebugServices() {
		host, port := splitProxyAddress(s.ProxyAddress)
		try := tryTCP(host, port)
		if s.Protocol == "UDP" {
			try = tryUDP(host, port)
		}
		fmt.Fprintf(w, "  %s:\n    %s\n", s.ServicePort, try)
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
func (l *lab) serve(ctx context.Context, w io.Writer, width int, metricsAddr string) error {
	if _, err := l.setStickyBackends(ctx, l.backends); err != nil {
		return err
	}
	if _, err := l.setWebFaults(ctx, "", nil); err != nil {
		return err
	}
	fmt.Fprintln(w, "\nServing until Ctrl-C, with all three backends. Every Service and its proxy socket:")
	l.printServices(w, width, "  ")
	fmt.Fprintln(w, "\nTry them (the proxy sockets: --serve installs no portal rules, so the ClusterIPs")
	fmt.Fprintln(w, "do not answer; demo --netns shows them answering):")
	l.printHints(w)
	fmt.Fprintf(w, "\nThe proxy's view:  curl -s http://%s/debug/services   (and /metrics)\n", metricsAddr)
	fmt.Fprintf(w, "The manifests:     %s\n", l.manifests.dir)
	fmt.Fprintln(w, "                   edit them (timeoutSeconds, endpoints, the kube-userspace-proxy/faults")
	fmt.Fprintln(w, "                   annotation of the fault section...) and the change is live within 1 s.")
	<-ctx.Done()
	fmt.Fprintln(w, "\nStopping: proxy sockets, backends and the manifest directory are removed.")
	return nil
}
