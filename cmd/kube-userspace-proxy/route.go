package main

import (
	"strconv"
	"strings"
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
