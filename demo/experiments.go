package demo

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// row is one line of the demo's tables: an experiment, what to expect (for
// the affinity experiments: what a real cluster did, kube-proxy in iptables
// mode, measured once with the same experiments), what this proxy did and
// whether the two agree.
type row struct {
	Experiment string
	Expected   string
	Ours       string
	Matched    bool
}

// The demo's two main clients. Each has a source address of its own, which
// is what the proxier keys ClientIP affinity on.
const (
	cli1 client = 11
	cli2 client = 12
)

// connections is how many new connections a distribution experiment makes,
// as on the real cluster.
const connections = 30

func failedRow(experiment, expected string, err error) row {
	return row{Experiment: experiment, Expected: expected, Ours: "error: " + err.Error()}
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
	const exp, cluster = "no affinity: client 1 opens 30 connections", "11/10/9 over the 3 pods (random)"
	addr, err := l.proxyAddr(webServicePort)
	if err != nil {
		return failedRow(exp, cluster, err)
	}
	names, err := l.accessMany(ctx, addr, cli1, connections)
	if err != nil {
		return failedRow(exp, cluster, err)
	}
	counts, summary := tally(names)
	// Round robin gives exactly 10/10/10; the cluster's random pick gave
	// 11/10/9. What must match is the outcome: every backend gets a share.
	even := len(counts) == len(l.backends) && counts[0]-counts[len(counts)-1] <= 3
	return row{Experiment: exp, Expected: cluster, Ours: summary + " (in turn)", Matched: even}
}

// stickyDistribution: with sessionAffinity ClientIP all connections of one
// client go to one backend.
// cluster is what the real cluster did for this client.
func (l *lab) stickyDistribution(ctx context.Context, label, cluster string, from client) (row, string) {
	exp := "client IP affinity: " + label + " opens 30 connections"
	addr, err := l.proxyAddr(stickyServicePort)
	if err != nil {
		return failedRow(exp, cluster, err), ""
	}
	names, err := l.accessMany(ctx, addr, from, connections)
	if err != nil {
		return failedRow(exp, cluster, err), ""
	}
	counts, _ := tally(names)
	ours := fmt.Sprintf("%d/%d on %s", counts[0], connections, names[0])
	return row{Experiment: exp, Expected: cluster, Ours: ours, Matched: len(counts) == 1}, names[0]
}

// udpSessions: each new client socket is a new UDP session, balanced like
// a new TCP connection; the answer must come back from the proxy address.
// The real cluster was not measured with UDP; this row shows the other
// protocol works.
func (l *lab) udpSessions() row {
	const exp, cluster, sessions = "UDP, no affinity: client 1 sends from 6 new sockets", "(not measured)", 6
	addr, err := l.proxyAddr(echoServicePort)
	if err != nil {
		return failedRow(exp, cluster, err)
	}
	var names []string
	for range sessions {
		name, err := accessUDP(l.cn, addr, l.addr(cli1))
		if err != nil {
			return failedRow(exp, cluster, err)
		}
		names = append(names, name)
	}
	counts, summary := tally(names)
	return row{Experiment: exp, Expected: cluster, Ours: summary + " (in turn)", Matched: len(counts) == len(l.backends)}
}
