package e2e

import (
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/test/harness"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/test/harness/netns"
)

// Our chains, as the design card names them.
var ourChains = []string{
	"KUBE-PORTALS-CONTAINER", "KUBE-PORTALS-HOST",
	"KUBE-NODEPORT-CONTAINER", "KUBE-NODEPORT-HOST",
	"KUBE-NODEPORT-NON-LOCAL", "KUBE-PROXY-PORT-GUARD", "KUBE-PORTALS-NON-LOCAL",
	"KUBE-PROXY-PORT-REJECT",
}

// save returns iptables-save of the namespace (v4), failing the test on error.
func save(t *testing.T, ns *netns.NS) string {
	t.Helper()
	out, err := ns.IPTablesSave(false)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

var targetPort = regexp.MustCompile(`(?:--to-ports |--to-destination [0-9.]+:)(\d+)`)

// proxyPort finds the proxy port of a service port from its container
// portal rule (REDIRECT --to-ports N or DNAT --to-destination IP:N).
func proxyPort(dump, portName string) (int, bool) {
	for _, line := range harness.RulesFor(dump, portName) {
		if !strings.HasPrefix(line, "-A KUBE-PORTALS-CONTAINER ") && !strings.HasPrefix(line, "-A KUBE-NODEPORT-CONTAINER ") {
			continue
		}
		if m := targetPort.FindStringSubmatch(line); m != nil {
			p, _ := strconv.Atoi(m[1])
			return p, true
		}
	}
	return 0, false
}

// duplicateRules returns every rule line that appears more than once in the
// dump (per table, as the dump is table-ordered).
func duplicateRules(dump string) []string {
	seen := map[string]int{}
	table := ""
	var dups []string
	for _, line := range strings.Split(dump, "\n") {
		if strings.HasPrefix(line, "*") {
			table = line
			continue
		}
		if !strings.HasPrefix(line, "-A ") {
			continue
		}
		key := table + " " + line
		seen[key]++
		if seen[key] == 2 {
			dups = append(dups, key)
		}
	}
	return dups
}

// oursIn returns the dump lines that mention any of our chains or our
// comments (what --cleanup must have removed).
func oursIn(dump string) []string {
	var out []string
	for _, line := range strings.Split(dump, "\n") {
		if strings.Contains(line, "kube-userspace-proxy") {
			out = append(out, line)
			continue
		}
		for _, c := range ourChains {
			if strings.Contains(line, c) {
				out = append(out, line)
				break
			}
		}
	}
	return out
}

// listening reports whether a socket of proto ("tcp"/"udp") is bound to
// port in the namespace (ss -H -l -n).
func listening(t *testing.T, ns *netns.NS, proto string, port int) bool {
	t.Helper()
	flag := "-Hlnt"
	if proto == "udp" {
		flag = "-Hlnu"
	}
	out, err := ns.Exec("ss", flag, "sport", "=", ":"+strconv.Itoa(port))
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(out) != ""
}
