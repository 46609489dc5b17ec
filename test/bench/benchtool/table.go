package main

import (
	"bufio"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
)

// Configurations in table order; run.sh uses the keys.
var configs = []struct{ key, title string }{
	{"direct", "direct (1 backend)"},
	{"dnat", "kernel DNAT"},
	{"haproxy", "HAProxy"},
	{"nginx", "nginx stream"},
	{"kup", "kube-userspace-proxy, goroutines"},
	{"kupel", "kube-userspace-proxy, event loop (default)"},
	{"kupbase", "kube-userspace-proxy before (BENCH_KUP_BASE_BIN), event loop"},
}

// figure is one row of the table.
type figure struct {
	key, title string
	count      bool // whole numbers: printed without decimals
}

// figures in table order. Rows whose key run.sh never wrote are left out;
// keys not listed here are appended with the key as title.
var figures = []figure{
	{key: "newconn_rps", title: "HTTP new connection per request (req/s)"},
	{key: "newconn_p50", title: "  … latency p50 (ms)"},
	{key: "newconn_p99", title: "  … latency p99 (ms)"},
	{key: "newconn_err", title: "  … errors (count)", count: true},
	{key: "newconn_cpu_us", title: "  … proxy CPU per connection and request (µs)"},
	{key: "newconn_idle", title: "  … machine CPU left idle (%)"},
	{key: "keepalive_rps", title: "HTTP keep-alive, 64 connections (req/s)"},
	{key: "keepalive_p99", title: "  … latency p99 (ms)"},
	{key: "keepalive_err", title: "  … errors (count)", count: true},
	{key: "keepalive_cpu_us", title: "  … proxy CPU per request (µs)"},
	{key: "keepalive_idle", title: "  … machine CPU left idle (%)"},
	{key: "tcp1_gbps", title: "TCP throughput, 1 stream (Gbit/s)"},
	{key: "tcp1_idle", title: "  … machine CPU left idle (%)"},
	{key: "tcp4_gbps", title: "TCP throughput, 4 streams (Gbit/s)"},
	{key: "tcp4_idle", title: "  … machine CPU left idle (%)"},
	{key: "udp_rps", title: "UDP request/response, 64 B (req/s)"},
	{key: "udp_loss", title: "  … loss (%)"},
	{key: "udp_cpu_us", title: "  … proxy CPU per request/response (µs)"},
	{key: "udp_idle", title: "  … machine CPU left idle (%)"},
	{key: "udpgso_rps", title: "UDP GSO bursts, 16 × 1,200 B per send (datagrams echoed/s)"},
	{key: "udpgso_loss", title: "  … loss (%)"},
	{key: "udpgso_cpu_us", title: "  … proxy CPU per datagram echoed (µs)"},
	{key: "udpgso_idle", title: "  … machine CPU left idle (%)"},
	{key: "cpu_per_gb1", title: "proxy CPU per GB, 1 stream (s/GB)"},
	{key: "cpu_per_gb4", title: "proxy CPU per GB, 4 streams (s/GB)"},
	{key: "rss_idle_kib", title: "proxy RSS per idle connection (KiB)"},
	{key: "fds_idle", title: "proxy descriptors per idle connection"},
}

// samples holds every value of one figure, by configuration.
type samples map[string][]float64

// readSamples parses run.sh's raw file: "figure config rep value" per line,
// value "NA" when a configuration has no such figure (HAProxy and UDP).
func readSamples(r io.Reader) (map[string]samples, []string, error) {
	out := map[string]samples{}
	var order []string
	sc := bufio.NewScanner(r)
	for line := 1; sc.Scan(); line++ {
		f := strings.Fields(sc.Text())
		if len(f) == 0 || strings.HasPrefix(f[0], "#") {
			continue
		}
		if len(f) != 4 {
			return nil, nil, fmt.Errorf("line %d: want \"figure config rep value\", got %q", line, sc.Text())
		}
		if out[f[0]] == nil {
			out[f[0]] = samples{}
			order = append(order, f[0])
		}
		if f[3] == "NA" {
			continue
		}
		v, err := strconv.ParseFloat(f[3], 64)
		if err != nil {
			return nil, nil, fmt.Errorf("line %d: %w", line, err)
		}
		out[f[0]][f[1]] = append(out[f[0]][f[1]], v)
	}
	return out, order, sc.Err()
}

// stats are the median and range of one cell.
type stats struct {
	median, min, max float64
	n                int
}

func summarize(vs []float64) (stats, bool) {
	if len(vs) == 0 {
		return stats{}, false
	}
	s := slices.Clone(vs)
	slices.Sort(s)
	m := s[len(s)/2]
	if len(s)%2 == 0 {
		m = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return stats{median: m, min: s[0], max: s[len(s)-1], n: len(s)}, true
}

// formatNumber keeps three significant digits, with thousands separators
// for large values.
func formatNumber(v float64) string {
	a := math.Abs(v)
	switch {
	case a >= 1000:
		s := strconv.FormatInt(int64(math.Round(v)), 10)
		neg := strings.HasPrefix(s, "-")
		s = strings.TrimPrefix(s, "-")
		var b strings.Builder
		for i, c := range s {
			if i > 0 && (len(s)-i)%3 == 0 {
				b.WriteByte(',')
			}
			b.WriteRune(c)
		}
		if neg {
			return "-" + b.String()
		}
		return b.String()
	case a >= 100:
		return strconv.FormatFloat(v, 'f', 0, 64)
	case a >= 10:
		return strconv.FormatFloat(v, 'f', 1, 64)
	case a >= 1 || a == 0:
		return strconv.FormatFloat(v, 'f', 2, 64)
	}
	return strconv.FormatFloat(v, 'g', 3, 64)
}

func formatCell(s stats, ok, count bool) string {
	if !ok {
		return "n/a"
	}
	format := formatNumber
	if count {
		format = func(v float64) string { return strconv.FormatFloat(math.Round(v), 'f', 0, 64) }
	}
	if s.n == 1 || s.min == s.max {
		return format(s.median)
	}
	return fmt.Sprintf("%s (%s–%s)", format(s.median), format(s.min), format(s.max))
}

func formatRatio(num, den stats, okNum, okDen bool) string {
	if !okNum || !okDen || den.median == 0 {
		return "n/a"
	}
	return fmt.Sprintf("%.2f×", num.median/den.median)
}

// ratios are the columns after the configurations: numerator and
// denominator keys and the header.
var ratios = []struct{ num, den, title string }{
	{"kup", "dnat", "goroutines ÷ DNAT"},
	{"kup", "haproxy", "goroutines ÷ HAProxy"},
	{"kup", "nginx", "goroutines ÷ nginx"},
	{"kupel", "dnat", "event loop ÷ DNAT"},
	{"kupel", "haproxy", "event loop ÷ HAProxy"},
	{"kupel", "nginx", "event loop ÷ nginx"},
	{"kupel", "kupbase", "event loop ÷ before"},
	{"kupbase", "dnat", "before ÷ DNAT"},
	{"kupbase", "nginx", "before ÷ nginx"},
	{"haproxy", "dnat", "HAProxy ÷ DNAT"},
	{"nginx", "dnat", "nginx ÷ DNAT"},
}

// renderTable writes the markdown table of all figures.
func renderTable(w io.Writer, data map[string]samples, order []string) {
	rows := []figure{}
	for _, f := range figures {
		if data[f.key] != nil {
			rows = append(rows, f)
		}
	}
	for _, k := range order {
		if !slices.ContainsFunc(figures, func(f figure) bool { return f.key == k }) {
			rows = append(rows, figure{key: k, title: k})
		}
	}
	// A configuration no figure has (a run without it) gets no column.
	measured := map[string]bool{}
	for _, bycfg := range data {
		for cfg := range bycfg {
			measured[cfg] = true
		}
	}
	cols := slices.DeleteFunc(slices.Clone(configs), func(c struct{ key, title string }) bool { return !measured[c.key] })
	rats := slices.DeleteFunc(slices.Clone(ratios), func(r struct{ num, den, title string }) bool {
		return !measured[r.num] || !measured[r.den]
	})
	header := []string{"figure"}
	for _, c := range cols {
		header = append(header, c.title)
	}
	for _, r := range rats {
		header = append(header, r.title)
	}
	fmt.Fprintf(w, "| %s |\n", strings.Join(header, " | "))
	fmt.Fprintf(w, "|%s\n", strings.Repeat("---|", len(header)))
	for _, f := range rows {
		cells := []string{strings.Replace(f.title, "  ", "&nbsp;&nbsp;", 1)}
		st := map[string]stats{}
		ok := map[string]bool{}
		for _, c := range cols {
			st[c.key], ok[c.key] = summarize(data[f.key][c.key])
			cells = append(cells, formatCell(st[c.key], ok[c.key], f.count))
		}
		for _, r := range rats {
			cells = append(cells, formatRatio(st[r.num], st[r.den], ok[r.num], ok[r.den]))
		}
		fmt.Fprintf(w, "| %s |\n", strings.Join(cells, " | "))
	}
}

// runTable renders the raw samples file as a markdown table on stdout.
func runTable(args []string) error {
	fs := flag.NewFlagSet("table", flag.ExitOnError)
	_ = fs.Parse(args)
	r, err := openArg(fs.Args())
	if err != nil {
		return err
	}
	defer r.Close()
	data, order, err := readSamples(r)
	if err != nil {
		return err
	}
	renderTable(os.Stdout, data, order)
	return nil
}
