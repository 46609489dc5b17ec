package demo

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
)

// row is one line of the demo's table: an experiment of seed 000, what
// the seed measured on a real cluster (kube-proxy in iptables mode) and
// what this proxy did.
type row struct {
	Experiment string
	Seed       string
	Ours       string
	Matched    bool
}

// The demo's clients. Each is a distinct loopback source address, which is
// what the proxier keys ClientIP affinity on.
var (
	cli1 = clientIP(11)
	cli2 = clientIP(12)
)

// connections is how many new connections a distribution experiment makes,
// as in the seed.
const connections = 30

func failedRow(experiment, seed string, err error) row {
	return row{Experiment: experiment, Seed: seed, Ours: "error: " + err.Error()}
}

// tally counts answers per backend, most first: "10/10/10".
func tally(names []string) (counts []int, summary string) {
	per := map[string]int{}
	for _, n := range names {
		per[n]++
	}
	for _, c := range per {
		counts = append(counts, c)
	}
	slices.SortFunc(counts, func(a, b int) int { return b - a })
	parts := make([]string, len(counts))
	for i, c := range counts {
		parts[i] = strconv.Itoa(c)
	}
	return counts, strings.Join(parts, "/")
}

// plainDistribution: with sessionAffinity None every new connection is
// balanced afresh, so one client spreads over all backends.
func (l *lab) plainDistribution(ctx context.Context) row {
	const exp, seed = "plain (None): cli1, 30 new connections", "11/10/9 (random)"
	addr, err := l.proxyAddr(webServicePort)
	if err != nil {
		return failedRow(exp, seed, err)
	}
	names, err := accessMany(ctx, addr, cli1, connections)
	if err != nil {
		return failedRow(exp, seed, err)
	}
	counts, summary := tally(names)
	// Round robin gives exactly 10/10/10; the seed's random pick gave
	// 11/10/9. What must match is the outcome: every backend gets a share.
	even := len(counts) == len(l.backends) && counts[0]-counts[len(counts)-1] <= 3
	return row{Experiment: exp, Seed: seed, Ours: summary + " (round robin)", Matched: even}
}

// stickyDistribution: with sessionAffinity ClientIP all connections of one
// client go to one backend.
// seed is what the seed reported for this client.
func (l *lab) stickyDistribution(ctx context.Context, label, seed string, from netip.Addr) (row, string) {
	exp := "sticky (ClientIP): " + label + ", 30 new connections"
	addr, err := l.proxyAddr(stickyServicePort)
	if err != nil {
		return failedRow(exp, seed, err), ""
	}
	names, err := accessMany(ctx, addr, from, connections)
	if err != nil {
		return failedRow(exp, seed, err), ""
	}
	counts, _ := tally(names)
	ours := fmt.Sprintf("%d/%d on %s", counts[0], connections, names[0])
	return row{Experiment: exp, Seed: seed, Ours: ours, Matched: len(counts) == 1}, names[0]
}

// udpSessions: each new client socket is a new UDP session, balanced like
// a new TCP connection; the answer must come back from the proxy address.
// The seed has no UDP experiment; this row shows the other protocol works.
func (l *lab) udpSessions() row {
	const exp, seed, sessions = "udp (None): cli1, 6 new sessions", "(not measured)", 6
	addr, err := l.proxyAddr(echoServicePort)
	if err != nil {
		return failedRow(exp, seed, err)
	}
	var names []string
	for range sessions {
		name, err := accessUDP(addr, cli1)
		if err != nil {
			return failedRow(exp, seed, err)
		}
		names = append(names, name)
	}
	counts, summary := tally(names)
	return row{Experiment: exp, Seed: seed, Ours: summary + " (round robin)", Matched: len(counts) == len(l.backends)}
}
