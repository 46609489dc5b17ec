package e2ecp

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"testing"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/test/harness/netns"
)

// nodeDrops are the node namespace's counters of packets that a connection could lose
// without the proxy ever seeing them, read so that a failed connection in the rollout
// can be told apart: the proxy-port guard's DROP rules, and conntrack's invalid and
// dropped packets and failed inserts (clashes).
type nodeDrops struct {
	guard                        uint64
	invalid, insertFailed, dropd uint64
}

func (d nodeDrops) minus(o nodeDrops) nodeDrops {
	return nodeDrops{d.guard - o.guard, d.invalid - o.invalid, d.insertFailed - o.insertFailed, d.dropd - o.dropd}
}

func (d nodeDrops) String() string {
	return fmt.Sprintf("guard DROP %d, conntrack invalid %d, insert_failed %d, drop %d",
		d.guard, d.invalid, d.insertFailed, d.dropd)
}

// readNodeDrops reads the counters in node.
func readNodeDrops(t *testing.T, node *netns.NS) nodeDrops {
	t.Helper()
	var d nodeDrops
	out := node.MustExec("iptables", "-w", "-t", "filter", "-L", "KUBE-PROXY-PORT-GUARD", "-n", "-v", "-x")
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) > 2 && f[2] == "DROP" {
			n, err := strconv.ParseUint(f[0], 10, 64)
			if err != nil {
				t.Fatalf("guard counter %q: %v", line, err)
			}
			d.guard += n
		}
	}
	stats, err := parseConntrackStats(node.MustExec("cat", "/proc/net/stat/nf_conntrack"))
	if err != nil {
		t.Fatal(err)
	}
	d.invalid, d.insertFailed, d.dropd = stats["invalid"], stats["insert_failed"], stats["drop"]
	return d
}

// parseConntrackStats sums /proc/net/stat/nf_conntrack's per-CPU rows (hexadecimal) by
// column name.
func parseConntrackStats(text string) (map[string]uint64, error) {
	lines := strings.Split(strings.TrimSpace(text), "\n")
	if len(lines) < 2 {
		return nil, fmt.Errorf("nf_conntrack stats: %d lines", len(lines))
	}
	names := strings.Fields(lines[0])
	sums := map[string]uint64{}
	for _, row := range lines[1:] {
		for i, field := range strings.Fields(row) {
			if i >= len(names) {
				break
			}
			v, err := strconv.ParseUint(field, 16, 64)
			if err != nil {
				return nil, fmt.Errorf("nf_conntrack stats %s=%q: %w", names[i], field, err)
			}
			sums[names[i]] += v
		}
	}
	return sums, nil
}

// unNATed counts the node's conntrack entries of TCP flows to dst that were not NATed:
// SYNs sent before dst's portal rule existed. Their entries live on (SYN_SENT, 120 s), so
// a client that reuses such a source port meets the old, un-NATed entry instead of the
// portal rule and its connection times out.
func unNATed(t *testing.T, node *netns.NS, dst netip.AddrPort) int {
	t.Helper()
	n := 0
	for _, line := range strings.Split(node.MustExec("cat", "/proc/net/nf_conntrack"), "\n") {
		if isUnNATed(line, dst) {
			n++
		}
	}
	return n
}

// isUnNATed reports whether one /proc/net/nf_conntrack line is a TCP flow to dst whose
// reply direction still comes from dst (no DNAT or REDIRECT was applied).
func isUnNATed(line string, dst netip.AddrPort) bool {
	f := strings.Fields(line)
	if len(f) < 3 || f[2] != "tcp" {
		return false
	}
	var srcs, dsts, dports []string
	for _, kv := range f {
		switch {
		case strings.HasPrefix(kv, "src="):
			srcs = append(srcs, kv[4:])
		case strings.HasPrefix(kv, "dst="):
			dsts = append(dsts, kv[4:])
		case strings.HasPrefix(kv, "dport="):
			dports = append(dports, kv[6:])
		}
	}
	if len(srcs) < 2 || len(dsts) < 1 || len(dports) < 1 {
		return false
	}
	ip := dst.Addr().String()
	return dsts[0] == ip && dports[0] == strconv.Itoa(int(dst.Port())) && srcs[1] == ip
}
