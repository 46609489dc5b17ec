package e2e

import (
	"slices"
	"strings"
	"testing"
	"time"
)

// checkFaultsInvalid: a Service whose faults annotation turns invalid (a toxic of an
// unknown type) is reported naming the file, the object and the field, like any
// other manifest error, and keeps serving with its last valid faults (latency 300 ms)
// however long the bad version stays; the next valid version takes effect as usual.
func checkFaultsInvalid(t *testing.T, e *env) {
	s := e.svcs["stubborn"]
	cl := e.pod1(ipFaultInvalid)
	s.faults = latencyFaults
	rewriteFaults(t, e, s, cl, "tcp", "delayed past the poll timeout by the latency toxic", delayed)
	base := timedAsks(t, cl, "tcp", s.tcp(), 1)

	s.faults = unknownFaults
	time.Sleep(faultQuiet)
	writeSvc(t, e.p.dir, s)
	var kept []time.Duration
	for wrote := time.Now(); time.Since(wrote) < faultWindow; {
		kept = append(kept, timedAsks(t, cl, "tcp", s.tcp(), 1)...)
	}
	if least := slices.Min(kept); least < latencyAdded {
		t.Errorf("tcp %s: a request took %v after the annotation turned invalid: the last valid latency toxic was dropped (all: %s)",
			s.tcp(), least, ms(kept))
	}
	checkDeclared(t, e, map[string][]string{s.portName("http"): {"slow/annotation"}})
	want := []string{s.name + ".yaml", "Service " + testNamespace + "/" + s.name,
		"metadata.annotations[" + faultsAnnotation + "]", "[0].type", `"explode"`}
	var reported string
	for _, line := range e.p.LogLines("explode") {
		if containsAll(line, want) {
			reported = line
			break
		}
	}
	if reported == "" {
		t.Errorf("no log line names all of %q; lines about it:\n%s", want, strings.Join(e.p.LogLines("explode", s.name), "\n"))
	}

	s.faults = ""
	fixedIn := rewriteFaults(t, e, s, cl, "tcp", "answered by b1 once the annotation is removed", answeredBy("b1"))
	figure(t, "faults annotation invalid: latency kept for %s (%d requests, %s; before: %s); reported: %s; next valid version live in %d ms",
		faultWindow, len(kept), ms(kept), ms(base), strings.TrimSpace(reported), fixedIn.Milliseconds())
}

// containsAll reports whether s contains every one of subs.
func containsAll(s string, subs []string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}
