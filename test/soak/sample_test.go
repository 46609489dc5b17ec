package soak

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"
)

// sample is one look at the proxy process.
type sample struct {
	At         time.Duration // since the traffic started
	RSSKiB     float64       // VmRSS
	FDs        float64       // entries in /proc/PID/fd
	Goroutines float64       // go_goroutines on /metrics
	// Vanished is how many proxied connections from vanished clients the
	// proxy still holds (established sockets to their addresses): until dead
	// peers are reaped each one keeps descriptors and goroutines, and the
	// "other" series subtract them to show whether anything else grows.
	Vanished float64
}

// series names a sample field, for the table, the fits and the plot.
type series struct {
	Name string
	Unit string
	Get  func(sample) float64
	// Tolerance is the largest slope per minute (after warm-up) a healthy
	// run shows; beyond it the run fails as growing.
	Tolerance float64
	// MinWindow is the shortest time after warm-up over which the slope
	// means anything (RSS follows the GC's heap target for minutes).
	MinWindow time.Duration
	// DeadPeers marks the series that grow if dead peers are not reaped
	// (as before keep-alive on the proxied sockets): fatal only with
	// -soak.strict.
	DeadPeers bool
}

// probe reads RSS and descriptors from /proc/pid and goroutines from the
// metrics endpoint (metrics URL fetched with client).
type probe struct {
	pid      int
	client   *http.Client
	metrics  string
	vanished func() (float64, error)
}

func (p probe) take(at time.Duration) (sample, error) {
	s := sample{At: at}
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.pid))
	if err != nil {
		return s, err
	}
	for _, line := range strings.Split(string(status), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
			s.RSSKiB, _ = strconv.ParseFloat(f[1], 64)
		}
	}
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", p.pid))
	if err != nil {
		return s, err
	}
	s.FDs = float64(len(fds))
	g, err := p.goroutines()
	if err != nil {
		return s, err
	}
	s.Goroutines = g
	if s.Vanished, err = p.vanished(); err != nil {
		return s, err
	}
	return s, nil
}

func (p probe) goroutines() (float64, error) {
	resp, err := p.client.Get(p.metrics)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "go_goroutines "); ok {
			_, _ = io.Copy(io.Discard, resp.Body)
			return strconv.ParseFloat(strings.TrimSpace(v), 64)
		}
	}
	return 0, fmt.Errorf("no go_goroutines on %s", p.metrics)
}

// sampleEvery takes a sample every period until ctx ends; a failed sample is
// reported on errs and skipped.
func (p probe) sampleEvery(ctx context.Context, start time.Time, period time.Duration, errs func(error)) []sample {
	var out []sample
	tick := time.NewTicker(period)
	defer tick.Stop()
	for {
		if s, err := p.take(time.Since(start)); err != nil {
			errs(err)
		} else {
			out = append(out, s)
		}
		select {
		case <-ctx.Done():
			return out
		case <-tick.C:
		}
	}
}

// fit is the least-squares line through the samples taken at or after from:
// slope per minute and intercept.
func fit(samples []sample, get func(sample) float64, from time.Duration) (perMin, at0 float64, n int) {
	var sx, sy, sxx, sxy float64
	for _, s := range samples {
		if s.At < from {
			continue
		}
		x, y := s.At.Minutes(), get(s)
		sx, sy, sxx, sxy = sx+x, sy+y, sxx+x*x, sxy+x*y
		n++
	}
	if n < 3 {
		return 0, 0, n
	}
	fn := float64(n)
	den := fn*sxx - sx*sx
	if den == 0 {
		return 0, sy / fn, n
	}
	perMin = (fn*sxy - sx*sy) / den
	return perMin, (sy - perMin*sx) / fn, n
}
