package demo

import (
	"fmt"
	"io"
)

// table collects the rows of one section as they are measured, prints a dot
// for each so the user sees the experiments happen, and prints the whole
// table (columns fitted to their content, see textTable) at the end.
type table struct {
	w      io.Writer
	width  int
	titles []string
	rows   []row
	notes  [][]string // per row
}

// newTable titles the columns: what was done, what to compare with, what
// this proxy did, and whether the two agree (verdict: "same?", "as expected?").
func newTable(w io.Writer, width int, what, expected, ours, verdict string) *table {
	return &table{w: w, width: width, titles: []string{what, expected, ours, verdict}}
}

// start says what is about to run and how long it takes; the dots follow.
func (t *table) start(what string) {
	fmt.Fprintf(t.w, "%s ", what)
}

func (t *table) add(rows ...row) {
	for _, r := range rows {
		t.rows = append(t.rows, r)
		t.notes = append(t.notes, nil)
		fmt.Fprint(t.w, ".")
	}
}

// note adds lines about a step (a manifest rewrite, its delay) under the
// last row.
func (t *table) note(lines ...string) {
	if len(t.rows) == 0 {
		return
	}
	t.notes[len(t.notes)-1] = append(t.notes[len(t.notes)-1], lines...)
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

// interrupted ends the line of dots when the section stops early (Ctrl-C),
// so that what is printed next starts a line of its own.
func (t *table) interrupted() {
	fmt.Fprintln(t.w)
}

// print ends the dots and prints the table.
func (t *table) print() {
	fmt.Fprint(t.w, " done\n\n")
	tt := textTable{titles: t.titles, width: t.width}
	for i, r := range t.rows {
		same := "yes"
		if !r.Matched {
			same = "NO"
		}
		tt.rows = append(tt.rows, tableRow{cells: []string{r.Experiment, r.Expected, r.Ours, same}, notes: t.notes[i]})
	}
	tt.render(t.w)
}

// verdict prints the table, then claim with yes or NO and the count of
// matched rows, then how to read the table, and reports whether every row
// matched.
func (t *table) verdict(claim, howToRead string) bool {
	t.print()
	all, n := t.matched()
	verdict := "yes"
	if !all {
		verdict = "NO"
	}
	fmt.Fprintf(t.w, "\n%s: %s (%d of %d)\n", claim, verdict, n, len(t.rows))
	fmt.Fprint(t.w, howToRead)
	return all
}

func (t *table) footer() bool {
	return t.verdict("Every outcome matched the real cluster", `
How to read it: kube-proxy in iptables mode picks a pod at random; this proxy
(like Kubernetes' old userspace mode) takes the pods in turn (round robin). So
plain traffic is spread exactly evenly here, and a client whose affinity has
expired gets whichever pod is next in turn: a different one or not, depending
on how many other clients connected in between. What must be the same is the
outcome: spread, kept on one pod, each client on its own pod, the timeout
counted from the last connection, moved to a surviving pod.
`)
}
