package demo

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/faults"
)

// The fault section: the plain Service, default/web, measured before,
// during and after toxics declared in its kube-userspace-proxy/faults
// annotation, as a user would declare them: by rewriting the manifest.
const (
	// faultConnections new connections are measured per step, faultParallel
	// at a time: 300 ms of latency then costs 2.4 s rather than 12 s, and
	// the samples are spread over enough time that one stall of a busy
	// machine (a GC pause, a descheduled process) delays a few of them but
	// not the median.
	faultConnections = 40
	faultParallel    = 5
	// fastP50 is the bar for "no fault": through the proxy on loopback a
	// connection gets its answer in about a millisecond; a tenth of a
	// second leaves room for a loaded machine or the race detector.
	fastP50 = 100 * time.Millisecond
	// The latency toxic adds 300 ms; anything from 250 to 450 ms passes.
	minAddedLatency = 250 * time.Millisecond
	maxAddedLatency = 450 * time.Millisecond
)

// The annotations, as a user would write them: Toxiproxy's JSON. The first
// is the example of the faults contract.
const (
	// A space after each comma lets a note wrap the JSON between fields.
	latencyToxic = `[{"name": "slow", "type": "latency", "stream": "downstream", "toxicity": 1.0, "attributes": {"latency": 300, "jitter": 0}}]`
	resetToxic   = `[{"name": "cut", "type": "reset_peer", "stream": "downstream", "toxicity": 0.5, "attributes": {"timeout": 0}}]`
)

// Toxicity 0.5 over 40 connections: the count is drawn, so "about half" is
// 10 to 30. A fair coin lands outside that 0.07 % of the time, so the check
// holds whatever --fault-seed is. The draw is a pure function of the seed
// and the connection's number on the port, so with the demo's default seed
// and fixed sequence the count is the same every run (20 today).
const (
	minResets = faultConnections / 4
	maxResets = faultConnections - faultConnections/4
)

// probe is what one step's connections saw.
type probe struct {
	n          int
	answered   []time.Duration // each answered connection's time to the full answer, sorted
	resets     int             // connections whose client saw a TCP reset
	firstReset error
	others     int // failures other than a reset
	firstOther error
}

func (p probe) errors() int { return p.resets + p.others }

// p50 is the median time of the answered connections (nearest rank).
func (p probe) p50() (time.Duration, bool) {
	if len(p.answered) == 0 {
		return 0, false
	}
	return p.answered[(len(p.answered)+1)/2-1], true
}

// measure makes n new connections from from to proxy, parallel at a time,
// and times each until the backend's answer has arrived and the connection
// closed.
func measure(ctx context.Context, cn clientNet, proxy netip.AddrPort, from netip.Addr, n, parallel int) probe {
	took := make([]time.Duration, n)
	errs := make([]error, n)
	slots := make(chan struct{}, parallel)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			slots <- struct{}{}
			defer func() { <-slots }()
			start := time.Now()
			_, errs[i] = accessTCP(ctx, cn, proxy, from)
			took[i] = time.Since(start)
		})
	}
	wg.Wait()
	return tallyProbe(took, errs)
}

// tallyProbe sorts connections into answered (with their time), reset and
// failed otherwise.
func tallyProbe(took []time.Duration, errs []error) probe {
	p := probe{n: len(errs)}
	for i, err := range errs {
		switch {
		case err == nil:
			p.answered = append(p.answered, took[i])
		case errors.Is(err, syscall.ECONNRESET):
			p.resets++
			p.firstReset = firstErr(p.firstReset, err)
		default:
			p.others++
			p.firstOther = firstErr(p.firstOther, err)
		}
	}
	slices.Sort(p.answered)
	return p
}

// faultStep is one row of the fault table: the annotation to declare
// (none: ""), what a learner should expect and how to judge it against the
// first step's measurement.
type faultStep struct {
	fault      string
	annotation string
	toxics     []string // the toxic names the proxier shows once it applied annotation
	rewrite    bool     // rewrite the manifest first (the first step measures it as it is)
	expected   string
	judge      func(before, got probe) (measured string, ok bool)
}

func faultSteps() []faultStep {
	return []faultStep{
		{
			fault:    "no fault: web as it is",
			expected: fmt.Sprintf("median under %s, 0/%d errors", ms(fastP50), faultConnections),
			judge:    judgeFast,
		},
		{
			fault:      "latency: every reply held back 300 ms",
			annotation: latencyToxic, toxics: []string{"slow"}, rewrite: true,
			expected: fmt.Sprintf("median 300ms later (%d-%d ok), 0 errors", minAddedLatency.Milliseconds(), maxAddedLatency.Milliseconds()),
			judge:    judgeLatency,
		},
		{
			fault:      "reset_peer: half the connections cut with a TCP reset",
			annotation: resetToxic, toxics: []string{"cut"}, rewrite: true,
			expected: fmt.Sprintf("about half: %d-%d of %d reset, rest ok", minResets, maxResets, faultConnections),
			judge:    judgeResets,
		},
		{
			fault:    "no fault: annotation removed",
			rewrite:  true,
			expected: fmt.Sprintf("as before: median under %s, 0 errors", ms(fastP50)),
			judge:    judgeFast,
		},
	}
}

func summary(p probe) string {
	p50, ok := p.p50()
	if !ok {
		return fmt.Sprintf("no answer, %d/%d errors", p.errors(), p.n)
	}
	return fmt.Sprintf("median %s, %d/%d errors", ms(p50), p.errors(), p.n)
}

// judgeFast: no fault, so every connection answers, quickly.
func judgeFast(_, got probe) (string, bool) {
	p50, ok := got.p50()
	return summary(got), ok && p50 < fastP50 && got.errors() == 0
}

// judgeLatency: every connection answers, about 300 ms later than before.
func judgeLatency(before, got probe) (string, bool) {
	p50, ok := got.p50()
	base, baseOK := before.p50()
	if !ok || !baseOK {
		return summary(got), false
	}
	added := p50 - base
	measured := fmt.Sprintf("median %s (+%s), %d/%d errors", ms(p50), ms(added), got.errors(), got.n)
	return measured, added >= minAddedLatency && added <= maxAddedLatency && got.errors() == 0
}

// judgeResets: about half the connections reset, the others answer; any
// other failure (a timeout, a close without a reset) is wrong.
func judgeResets(_, got probe) (string, bool) {
	measured := fmt.Sprintf("%d/%d reset by the proxy, %d answered", got.resets, got.n, len(got.answered))
	if got.others > 0 {
		measured = fmt.Sprintf("%d/%d reset, %d answered, %d failed otherwise", got.resets, got.n, len(got.answered), got.others)
	}
	return measured, got.others == 0 && got.resets >= minResets && got.resets <= maxResets
}

// faultSection runs the steps in order and prints their table; it reports
// whether every step behaved as expected. An error means ctx ended.
func (l *lab) faultSection(ctx context.Context, w io.Writer, width int) (bool, error) {
	fmt.Fprint(w, faultIntro())
	t := newTable(w, width, "fault on default/web", "expected", "measured", "as expected?")
	t.start("Running 4 steps (about 5 s)")
	var before probe
	for i, s := range faultSteps() {
		r := row{Experiment: s.fault, Expected: s.expected}
		got, notes, err := l.faultStep(ctx, s)
		if err != nil {
			r.Ours = "error: " + err.Error()
		} else {
			if i == 0 {
				before = got
			}
			r.Ours, r.Matched = s.judge(before, got)
		}
		t.add(r)
		t.note(notes...)
		if err := ctx.Err(); err != nil {
			t.interrupted()
			return false, err
		}
	}
	return t.verdict("Every fault behaved as expected", `
How to read it: a fault acts inside the proxy, between the client and the
backend; the backends are untouched. "latency" holds each reply back 300 ms, so
every answer arrives 300 ms later. "reset_peer" on the downstream stream with
timeout 0 drops the reply when it reaches the proxy and aborts the connection
with a TCP reset instead: the client's next read or write fails with
"connection reset by peer". Its "toxicity" 0.5 is the share of new
connections it hits: each is decided once, when it is accepted, by a random
draw that starts from --fault-seed, so running the demo again gives the same
count. A change applies to connections accepted after it; with the annotation
removed the Service is back as it was.
`), nil
}

// faultStep declares s's annotation (when s rewrites) and measures.
func (l *lab) faultStep(ctx context.Context, s faultStep) (probe, []string, error) {
	var notes []string
	if s.rewrite {
		before, _ := l.p.ProxyPort(webServicePort)
		took, err := l.setWebFaults(ctx, s.annotation, s.toxics)
		if err != nil {
			return probe{}, nil, err
		}
		if s.annotation == "" {
			notes = append(notes, fmt.Sprintf("annotation removed from %s: the proxy shows no fault after %s", webManifest, round(took)))
		} else {
			notes = append(notes, fmt.Sprintf("annotation %s: '%s'", faults.Annotation, s.annotation),
				fmt.Sprintf("%s rewritten: the proxy shows fault %q in force after %s", webManifest, s.toxics[0], round(took)))
		}
		// A Service keeps its proxy socket when only its annotation
		// changes; a client connected to the old port would otherwise break.
		if after, _ := l.p.ProxyPort(webServicePort); after != before {
			return probe{}, notes, fmt.Errorf("the proxy port moved from %d to %d", before, after)
		}
	}
	addr, err := l.proxyAddr(webServicePort)
	if err != nil {
		return probe{}, notes, err
	}
	got := measure(ctx, l.cn, addr, l.addr(cli1), faultConnections, faultParallel)
	if got.firstReset != nil {
		notes = append(notes, "a reset connection, as the client saw it: "+got.firstReset.Error())
	}
	if got.firstOther != nil {
		notes = append(notes, "first other error: "+got.firstOther.Error())
	}
	return got, notes, nil
}

// setWebFaults rewrites web's manifest with annotation and waits until the
// proxier shows exactly the toxics named (none: no annotation).
func (l *lab) setWebFaults(ctx context.Context, annotation string, toxics []string) (time.Duration, error) {
	if err := l.manifests.setWebFaults(annotation); err != nil {
		return 0, err
	}
	return l.waitFor(ctx, fmt.Sprintf("%s toxics %v", webServicePort, toxics), func() bool {
		return slices.Equal(l.toxicNames(webServicePort), toxics)
	})
}

// toxicNames lists the toxics in force on servicePort, as /debug/services
// shows them.
func (l *lab) toxicNames(servicePort string) []string {
	s, ok := l.service(servicePort)
	if !ok {
		return nil
	}
	names := make([]string, 0, len(s.Faults))
	for _, t := range s.Faults {
		names = append(names, t.Name)
	}
	return names
}

// ms prints a duration in milliseconds: 0.4ms below 10 ms, 301ms above.
func ms(d time.Duration) string {
	m := float64(d) / float64(time.Millisecond)
	if m < 10 && m > -10 {
		return fmt.Sprintf("%.1fms", m)
	}
	return fmt.Sprintf("%.0fms", m)
}

// faultIntro is the fault section's introduction, in lines of at most 80
// columns as the demo's other prose (one line was 82, and wrapped on an
// 80-column terminal).
func faultIntro() string {
	return fmt.Sprintf(`
Fault injection, on the same Service default/web (the one without affinity).
A fault is declared in the Service's annotation kube-userspace-proxy/faults, in
the JSON of Toxiproxy (a tool that injects faults; it calls them "toxics"), by
rewriting %s; each step waits until the proxy shows the fault in force.
Then %d new connections from client 1 (%d at a time) are each timed until the
backend's name has arrived: "median" is the middle one of those times, "errors"
the connections that got no answer.

`, webManifest, faultConnections, faultParallel)
}
