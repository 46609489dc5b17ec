package demo

import (
	"fmt"
	"io"
	"strings"
)

// table prints rows as they are measured, so the user watches the
// experiments happen rather than a 15-second silence.
type table struct {
	w    io.Writer
	rows []row
}

const rowFormat = "%-46s %-38s %-44s %s\n"

func (t *table) header() {
	t.titles("experiment", "seed 000 (kube-proxy, iptables mode)", "kube-userspace-proxy", "match")
}

// titles prints the column titles: what was done, what to compare with,
// what this proxy did, whether it matched.
func (t *table) titles(what, reference, ours, match string) {
	fmt.Fprintf(t.w, rowFormat, what, reference, ours, match)
	fmt.Fprintf(t.w, rowFormat, strings.Repeat("-", 46), strings.Repeat("-", 38), strings.Repeat("-", 44), "-----")
}

func (t *table) add(rows ...row) {
	for _, r := range rows {
		t.rows = append(t.rows, r)
		match := "yes"
		if !r.Matched {
			match = "NO"
		}
		fmt.Fprintf(t.w, rowFormat, r.Experiment, r.Seed, r.Ours, match)
	}
}

// note prints a line about a step (a manifest rewrite, its delay) under
// the row it belongs to.
func (t *table) note(lines ...string) {
	for _, l := range lines {
		fmt.Fprintf(t.w, "    └ %s\n", l)
	}
}

// matched reports whether every row matched, and how many did.
func (t *table) matched() (bool, int) {
	n := 0
	for _, r := range t.rows {
		if r.Matched {
			n++
		}
	}
	return n == len(t.rows), n
}

func (t *table) footer() bool {
	return t.verdict("Every outcome matched the seed", `
How to read it: kube-proxy's iptables mode picks a backend at random; this
proxy (like the legacy userspace mode) picks round robin. So plain traffic is
exactly even, and a client whose affinity expired takes the next backend in
turn: whether that is a different one depends on how many other clients
picked in between. The outcomes - spread, pinned, independent per client,
timeout counted from the last access, re-pinned to a survivor - are the same.
`)
}

// verdict prints claim with yes or NO and the count of matched rows, then
// how to read the table, and reports whether every row matched.
func (t *table) verdict(claim, howToRead string) bool {
	all, n := t.matched()
	verdict := "yes"
	if !all {
		verdict = "NO"
	}
	fmt.Fprintf(t.w, "\n%s: %s (%d/%d)\n", claim, verdict, n, len(t.rows))
	fmt.Fprint(t.w, howToRead)
	return all
}
