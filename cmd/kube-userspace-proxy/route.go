package main

import (
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"
)

// parseDefaultRouteInterface reads /proc/net/route and returns the interface
// of the IPv4 default route (destination and mask 0), or "".
func parseDefaultRouteInterface(table string) string {
	for i, line := range strings.Split(table, "\n") {
		f := strings.Fields(line)
		if i == 0 || len(f) < 8 {
			continue
		}
		if f[1] == "00000000" && f[7] == "00000000" {
			return f[0]
		}
	}
	return ""
}

// parseDefaultRoute6Interface reads /proc/net/ipv6_route and returns the
// interface of the IPv6 default route (::/0 with a next hop or a device,
// not a reject route on lo), or "".
func parseDefaultRoute6Interface(table string) string {
	const rtfReject = 0x0200
	for _, line := range strings.Split(table, "\n") {
		f := strings.Fields(line)
		if len(f) < 10 || f[1] != "00" || strings.Trim(f[0], "0") != "" {
			continue
		}
		flags, err := strconv.ParseUint(f[8], 16, 32)
		if err != nil || flags&rtfReject != 0 || f[9] == "lo" {
			continue
		}
		return f[9]
	}
	return ""
}

// defaultRoutes find each family's default-route address, for the node
// IPs of the portals and NodePorts (run and explain alike); explain's tests
// replace them to explain a node without a default route.
var defaultRoutes = struct{ v4, v6 func() netip.Addr }{defaultRouteIP, defaultRouteIP6}

// defaultRouteIP is the IPv4 address this node sends from on its default
// route: the address other hosts reach it on, and so the DNAT target for
// the node's own service traffic. It is the kernel's choice (routeSource),
// else the first address of the route's interface.
func defaultRouteIP() netip.Addr {
	data, err := os.ReadFile("/proc/thread-self/net/route")
	if err != nil {
		return netip.Addr{}
	}
	return defaultRouteSource(parseDefaultRouteInterface(string(data)), false)
}

// defaultRouteIP6 is defaultRouteIP for IPv6: a global address, or none.
func defaultRouteIP6() netip.Addr {
	data, err := os.ReadFile("/proc/thread-self/net/ipv6_route")
	if err != nil {
		return netip.Addr{}
	}
	return defaultRouteSource(parseDefaultRoute6Interface(string(data)), true)
}

// defaultRouteSource is the source address of the default route on
// ifname, "" for none: what the kernel picks, else ifname's first address.
// The first address alone was wrong on three node shapes: a VIP (a
// keepalived /32) listed before the node's address, gone when the VIP
// moved; a deprecated IPv6 address (preferred_lft 0), gone when it
// expired; and a routed node whose address is on lo with the route's
// `src` naming it (unnumbered uplinks), where there was none at all.
func defaultRouteSource(ifname string, six bool) netip.Addr {
	if ifname == "" {
		return netip.Addr{}
	}
	if a := routeSource(six); a.IsValid() {
		return a
	}
	return interfaceAddr(ifname, six)
}

// routeProbe stands for "any other host": a documentation address
// (RFC 5737, RFC 3849), which no node has a route of its own for, so the
// lookup takes the default route.
var routeProbe = struct{ v4, v6 string }{"192.0.2.1:9", "[2001:db8::1]:9"}

// routeSource asks the kernel which address it would send from to
// routeProbe: the default route's `src`, else its source selection (the
// address on the gateway's subnet, not a deprecated IPv6 one). A UDP
// connect only looks the route up: nothing is sent.
func routeSource(six bool) netip.Addr {
	network, probe := "udp4", routeProbe.v4
	var d net.Dialer
	if six {
		network, probe = "udp6", routeProbe.v6
		d.Control = preferPublicSource
	}
	c, err := d.Dial(network, probe)
	if err != nil {
		return netip.Addr{}
	}
	defer c.Close()
	ap, err := netip.ParseAddrPort(c.LocalAddr().String())
	if err != nil {
		return netip.Addr{}
	}
	a := ap.Addr().Unmap()
	if a.Is4() == six || a.IsLoopback() || a.IsUnspecified() || (six && !a.IsGlobalUnicast()) {
		return netip.Addr{}
	}
	return a
}

// ipv6PreferSrcPublic is linux/in6.h's IPV6_PREFER_SRC_PUBLIC (RFC 5014),
// which x/sys does not name.
const ipv6PreferSrcPublic = 0x0002

// preferPublicSource makes an IPv6 socket's source selection prefer a
// stable address to an RFC 4941 temporary one (use_tempaddr 2 prefers the
// temporary one): a privacy address is deprecated within a day and gone
// within a week, and a node IP taken from it restarted the proxy as it went.
func preferPublicSource(_, _ string, c syscall.RawConn) error {
	var serr error
	if err := c.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IPV6, unix.IPV6_ADDR_PREFERENCES, ipv6PreferSrcPublic)
	}); err != nil {
		return err
	}
	if serr != nil {
		klog.V(2).InfoS("Could not ask for a stable IPv6 source address; the kernel's default choice stands", "err", serr)
	}
	return nil
}

// interfaceAddr returns the first address of one family on ifname; for
// IPv6 a global one (a link-local address needs a zone, which rules cannot
// carry).
func interfaceAddr(ifname string, six bool) netip.Addr {
	if ifname == "" {
		return netip.Addr{}
	}
	ifc, err := net.InterfaceByName(ifname)
	if err != nil {
		return netip.Addr{}
	}
	addrs, _ := ifc.Addrs()
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok {
			ip, ok := netip.AddrFromSlice(n.IP)
			if !ok {
				continue
			}
			ip = ip.Unmap()
			if ip.Is4() != six && (!six || ip.IsGlobalUnicast()) {
				return ip
			}
		}
	}
	return netip.Addr{}
}
