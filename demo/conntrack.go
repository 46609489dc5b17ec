package demo

import (
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strings"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/proxier"
)

// conntrackSource reads a namespace's conntrack table one way. The demo
// tries them in order and says which one it used.
type conntrackSource struct {
	name string
	read func(ns netNS) ([]string, error)
}

var conntrackSources = []conntrackSource{
	{"/proc/net/nf_conntrack, read inside the node namespace", func(ns netNS) ([]string, error) {
		var data []byte
		err := ns.do(func() error {
			var err error
			// thread-self: /proc/self/net is the namespace of the process's
			// main thread, not of this one.
			data, err = os.ReadFile("/proc/thread-self/net/nf_conntrack")
			return err
		})
		return lines(string(data)), err
	}},
	{"conntrack -L, run in the node namespace", func(ns netNS) ([]string, error) {
		if _, err := exec.LookPath("conntrack"); err != nil {
			return nil, err
		}
		out, err := ns.exec("conntrack", "-L")
		return lines(string(out)), err
	}},
	{"netlink, with the proxy's own conntrack code (proxier.ConntrackEntries)", func(ns netNS) ([]string, error) {
		var out []string
		err := ns.do(func() error {
			var err error
			out, err = proxier.ConntrackEntries()
			return err
		})
		return out, err
	}},
}

func lines(s string) []string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.TrimSpace(l) != "" {
			out = append(out, l)
		}
	}
	return out
}

// readConntrack reads the table with the first source that works.
func readConntrack(ns netNS, sources []conntrackSource) ([]string, string, error) {
	var errs []string
	for _, s := range sources {
		entries, err := s.read(ns)
		if err == nil {
			return entries, s.name, nil
		}
		errs = append(errs, s.name+": "+err.Error())
	}
	return nil, "", fmt.Errorf("no way to read conntrack worked: %s", strings.Join(errs, "; "))
}

// ctEntry is one conntrack entry: the original direction (client to
// where it connected) and where the reply comes from, which after a DNAT
// is the rewritten destination.
type ctEntry struct {
	proto    string
	src, dst netip.AddrPort
	reply    netip.AddrPort // the reply's source
	state    string         // TCP state, when there is one
	line     string
}

// parseConntrack reads the key=value form that /proc/net/nf_conntrack,
// conntrack -L and netlink's flow strings share: the first src=, dst=,
// sport=, dport= are the original direction, the second src= and sport=
// the reply's source.
func parseConntrack(line string) (ctEntry, bool) {
	e := ctEntry{line: line}
	vals := map[string][]string{}
	for _, f := range strings.Fields(line) {
		switch {
		case f == "tcp" || f == "udp":
			if e.proto == "" {
				e.proto = f
			}
		case strings.ToUpper(f) == f && len(f) > 3 && !strings.Contains(f, "=") && !strings.HasPrefix(f, "["):
			e.state = f // ESTABLISHED, TIME_WAIT, ...
		default:
			if k, v, ok := strings.Cut(f, "="); ok {
				vals[k] = append(vals[k], v)
			}
		}
	}
	get := func(k string, i int) string {
		if len(vals[k]) > i {
			return vals[k][i]
		}
		return ""
	}
	addrPort := func(a, p string) netip.AddrPort {
		ap, _ := netip.ParseAddrPort(a + ":" + p)
		return ap
	}
	e.src = addrPort(get("src", 0), get("sport", 0))
	e.dst = addrPort(get("dst", 0), get("dport", 0))
	e.reply = addrPort(get("src", 1), get("sport", 1))
	return e, e.proto != "" && e.dst.IsValid() && e.reply.IsValid()
}

// printConntrack shows, per Service, how many connections conntrack holds
// to its ClusterIP and where their replies come from (the proxy socket:
// the portal's DNAT), and per backend the proxy's own connections to it.
func printConntrack(out io.Writer, width int, ns netNS, l *lab) {
	entries, source, err := readConntrack(ns, conntrackSources)
	fmt.Fprintln(out)
	if err != nil {
		paragraph(out, width, "Connection tracking: "+err.Error())
		return
	}
	paragraph(out, width, fmt.Sprintf("Connection tracking in the node namespace: %d entries, read from %s. Each says where a client connected and where the kernel sends the replies from.", len(entries), source))
	var parsed []ctEntry
	for _, line := range entries {
		if e, ok := parseConntrack(line); ok {
			parsed = append(parsed, e)
		}
	}
	t := textTable{width: width, indent: "  ", titles: []string{"connections", "entries", "one of them", "replies from"}}
	var sample *ctEntry
	for _, s := range l.p.DebugServices() {
		cluster, err := l.clusterAddr(s.ServicePort)
		if err != nil {
			continue
		}
		proto := strings.ToLower(s.Protocol)
		var these []ctEntry
		for _, e := range parsed {
			if e.proto == proto && e.dst == cluster {
				these = append(these, e)
			}
		}
		if len(these) == 0 {
			continue
		}
		e := these[0]
		if sample == nil && proto == "tcp" {
			sample = &these[0]
		}
		t.rows = append(t.rows, tableRow{cells: []string{
			fmt.Sprintf("client → %s %s", strings.TrimPrefix(s.ServicePort, "default/"), strings.ToUpper(proto)),
			fmt.Sprint(len(these)),
			fmt.Sprintf("%s → %s", e.src, e.dst),
			e.reply.String(),
		}})
	}
	for _, b := range l.backends {
		var these []ctEntry
		for _, e := range parsed {
			if e.dst.Addr() == b.TCPAddr().Addr() {
				these = append(these, e)
			}
		}
		if len(these) == 0 {
			continue
		}
		slices.SortFunc(these, func(a, b ctEntry) int { return strings.Compare(a.proto, b.proto) })
		e := these[0]
		t.rows = append(t.rows, tableRow{cells: []string{
			fmt.Sprintf("proxy → %s", b.Name),
			fmt.Sprint(len(these)),
			fmt.Sprintf("%s → %s", e.src, e.dst),
			e.reply.String(),
		}})
	}
	t.render(out)
	if sample != nil {
		fmt.Fprintln(out, "\n  One entry as the kernel lists it:")
		for _, part := range wrap(strings.Join(strings.Fields(sample.line), " "), width-4) {
			fmt.Fprintln(out, "    "+part)
		}
	}
	fmt.Fprintln(out)
	paragraph(out, width, "A client's connection to a ClusterIP is answered from the proxy socket: the portal rewrote its destination, and conntrack rewrites the replies back, so the client only ever sees the ClusterIP. The proxy then opens a second, ordinary connection to the backend it picked, answered from the backend itself (no NAT).")
}
