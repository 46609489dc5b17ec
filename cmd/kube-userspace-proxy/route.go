package main

import "strings"

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
