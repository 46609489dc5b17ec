package soak

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// verdict is one series' result: the fitted slope after warm-up and whether
// it is within tolerance.
type verdict struct {
	series
	first, last, lo, hi float64
	perMin              float64
	n                   int
	judged              bool // the window after warm-up is long enough for this series
	ok                  bool // not judged, or within tolerance
}

// judge fits every series after warm-up; a series whose MinWindow is longer
// than the run's window after warm-up is shown but not judged.
func judge(samples []sample, ss []series, warmup, duration time.Duration) []verdict {
	var out []verdict
	for _, s := range ss {
		v := verdict{series: s, lo: math.Inf(1), hi: math.Inf(-1)}
		for i, x := range samples {
			y := s.Get(x)
			if i == 0 {
				v.first = y
			}
			v.last = y
			v.lo, v.hi = min(v.lo, y), max(v.hi, y)
		}
		v.perMin, _, v.n = fit(samples, s.Get, warmup)
		v.judged = duration-warmup >= s.MinWindow
		v.ok = !v.judged || v.perMin <= s.Tolerance
		out = append(out, v)
	}
	return out
}

// run is everything a report shows.
type run struct {
	Started      time.Time
	Duration     time.Duration
	Warmup       time.Duration
	Services     int
	Backends     int
	ChurnWrites  int64
	Vanished     int64
	VanishEvery  time.Duration
	Stats        *tallies
	Samples      []sample
	Verdicts     []verdict
	IdleBefore   sample
	IdleAfter    sample
	IdleOK       bool // everything back to the start
	IdleOtherOK  bool // back to the start but for vanished clients' connections
	ProxyVersion string

	SvcChurnOps                     string // the Service-churn group's changes by kind
	SvcChurnCreated                 int
	SvcChurnAsked, SvcChurnAnswered int64
	FootBefore, FootAfter           footprint
	FootDiff                        string // "" when the footprint is back to the start
}

func (r run) markdown() string {
	var b strings.Builder
	fmt.Fprintf(&b, "# Soak results\n\n")
	fmt.Fprintf(&b, "Run started %s UTC, %v of traffic (%v warm-up excluded from the slopes), %d Services (TCP 80 + UDP 53 each) over %d backends; "+
		"endpoints churned every second (%d manifest rewrites: one endpoint added or removed, 1-5 per Service); one client host vanished without FIN every %v (%d in all, two kept-alive connections each). Binary: %s.\n\n",
		r.Started.UTC().Format("2006-01-02 15:04"), r.Duration, r.Warmup, r.Services, r.Backends, r.ChurnWrites, r.VanishEvery.Round(100*time.Millisecond), r.Vanished, r.ProxyVersion)
	b.WriteString("## Connections\n\n")
	b.WriteString("| traffic | ok | failed (endpoint listed) | cut after endpoint removed | lost/corrupted | bytes verified |\n|---|---:|---:|---:|---:|---:|\n")
	for _, k := range kinds {
		t := r.Stats.by[k]
		fmt.Fprintf(&b, "| %s | %d | %d | %d | %d | %s |\n", k, t.ok.Load(), t.failed.Load(), t.cutRemoved.Load(), t.corrupt.Load(), humanBytes(t.bytes.Load()))
	}
	b.WriteString("\n## Proxy resources\n\n")
	b.WriteString("| series | first | last | min | max | slope after warm-up (per min) | tolerance (per min) | samples fitted | verdict |\n|---|---:|---:|---:|---:|---:|---:|---:|---|\n")
	for _, v := range r.Verdicts {
		verdict := "flat"
		switch {
		case !v.judged:
			verdict = fmt.Sprintf("not judged (needs %v after warm-up)", v.MinWindow)
		case !v.ok:
			verdict = "**GROWS**"
		}
		fmt.Fprintf(&b, "| %s (%s) | %.0f | %.0f | %.0f | %.0f | %+.2f | %.2f | %d | %s |\n",
			v.Name, v.Unit, v.first, v.last, v.lo, v.hi, v.perMin, v.Tolerance, v.n, verdict)
	}
	idle := func(ok bool) string {
		if ok {
			return "back to the start"
		}
		return "**NOT back to the start**"
	}
	fmt.Fprintf(&b, "\nIdle before traffic: %.0f fds, %.0f goroutines, %.1f MiB RSS. Idle %v after traffic stopped: %.0f fds, %.0f goroutines, %.1f MiB RSS (%s), "+
		"with %.0f vanished clients' connections still held; without those %.0f fds, %.0f goroutines (%s).\n",
		r.IdleBefore.FDs, r.IdleBefore.Goroutines, r.IdleBefore.RSSKiB/1024, idleSettle,
		r.IdleAfter.FDs, r.IdleAfter.Goroutines, r.IdleAfter.RSSKiB/1024, idle(r.IdleOK),
		r.IdleAfter.Vanished, r.IdleAfter.FDs-2*r.IdleAfter.Vanished, r.IdleAfter.Goroutines-2*r.IdleAfter.Vanished, idle(r.IdleOtherOK))
	fmt.Fprintf(&b, "\n## Service churn\n\n%d Services created under fresh names and changed every %v (%s); %d of %d probe questions to their ports answered (not judged: ports vanish under them). "+
		"All deleted when the traffic stopped; %v later: %d rules, %d metric series (before the run %d, %d): %s.\n",
		r.SvcChurnCreated, churnEvery, r.SvcChurnOps, r.SvcChurnAnswered, r.SvcChurnAsked, idleSettle,
		len(r.FootAfter.Rules), r.FootAfter.series(), len(r.FootBefore.Rules), r.FootBefore.series(), idle(r.FootDiff == ""))
	if f := r.Stats.failures(); len(f) > 0 {
		b.WriteString("\n## First failures\n\n")
		for _, l := range f {
			fmt.Fprintf(&b, "- %s\n", l)
		}
	}
	b.WriteString("\nPlot: soak.svg; raw samples: samples.tsv.\n")
	return b.String()
}

func humanBytes(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.2f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	default:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
}

func tsv(samples []sample) string {
	var b strings.Builder
	b.WriteString("seconds\trss_kib\tfds\tgoroutines\tvanished_held\n")
	for _, s := range samples {
		fmt.Fprintf(&b, "%.1f\t%.0f\t%.0f\t%.0f\t%.0f\n", s.At.Seconds(), s.RSSKiB, s.FDs, s.Goroutines, s.Vanished)
	}
	return b.String()
}

// write puts results.md, soak.svg and samples.tsv into dir.
func (r run) write(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	files := map[string]string{
		"results.md":  r.markdown(),
		"soak.svg":    plot(r.Samples, r.Verdicts, r.Warmup),
		"samples.tsv": tsv(r.Samples),
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
			return err
		}
	}
	return nil
}
