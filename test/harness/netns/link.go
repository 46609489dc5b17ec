package netns

import "net/netip"

// End is one side of a veth link: the namespace, the interface name inside it
// and the addresses to put on it (the first one is the primary).
type End struct {
	NS    *NS
	If    string
	Addrs []netip.Prefix
}

// Veth links two namespaces with a veth pair, addresses both ends and brings
// them up. The pair is created directly inside the namespaces (never in the
// root namespace), so it disappears with them.
func Veth(a, b End) {
	a.NS.t.Helper()
	a.NS.MustIP("link", "add", a.If, "type", "veth", "peer", "name", b.If, "netns", b.NS.Name)
	for _, e := range []End{a, b} {
		for _, p := range e.Addrs {
			e.NS.MustIP("addr", "add", p.String(), "dev", e.If)
		}
		e.NS.MustIP("link", "set", e.If, "up")
	}
}

// Route adds a route inside the namespace: dst is a prefix or "default".
func (n *NS) Route(dst string, via netip.Addr) {
	n.t.Helper()
	n.MustIP("route", "add", dst, "via", via.String())
}
