package main

import (
	"bytes"
	"strings"
	"testing"
)

func TestSummarize(t *testing.T) {
	tests := []struct {
		in   []float64
		want stats
		ok   bool
	}{
		{nil, stats{}, false},
		{[]float64{5}, stats{5, 5, 5, 1}, true},
		{[]float64{9, 1, 5}, stats{5, 1, 9, 3}, true},
		{[]float64{4, 1, 2, 3}, stats{2.5, 1, 4, 4}, true},
	}
	for _, tt := range tests {
		got, ok := summarize(tt.in)
		if ok != tt.ok || got != tt.want {
			t.Errorf("summarize(%v) = %+v, %v; want %+v, %v", tt.in, got, ok, tt.want, tt.ok)
		}
	}
}

func TestFormatNumber(t *testing.T) {
	tests := []struct {
		in   float64
		want string
	}{
		{0, "0.00"}, {0.01234, "0.0123"}, {1.5, "1.50"}, {12.34, "12.3"}, {123.4, "123"},
		{1234.5, "1,235"}, {1234567, "1,234,567"}, {-2500, "-2,500"},
	}
	for _, tt := range tests {
		if got := formatNumber(tt.in); got != tt.want {
			t.Errorf("formatNumber(%v) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

func TestRenderTable(t *testing.T) {
	raw := `# figure config rep value
newconn_rps direct 1 1000
newconn_rps dnat 1 800
newconn_rps dnat 2 900
newconn_rps dnat 3 1000
newconn_rps haproxy 1 450
newconn_rps nginx 1 600
newconn_rps kup 1 720
udp_rps haproxy 1 NA
udp_rps dnat 1 100
udp_rps kup 1 60
udp_rps nginx 1 40
extra_fig kup 1 7
newconn_err kup 1 0
newconn_err kup 2 12
newconn_err kup 3 3
`
	got := render(t, raw)
	for _, want := range []string{
		"| figure | direct (1 backend) | kernel DNAT | HAProxy | nginx stream | kube-userspace-proxy, goroutines | goroutines ÷ DNAT | goroutines ÷ HAProxy | goroutines ÷ nginx | HAProxy ÷ DNAT | nginx ÷ DNAT |",
		"| HTTP new connection per request (req/s) | 1,000 | 900 (800–1,000) | 450 | 600 | 720 | 0.80× | 1.60× | 1.20× | 0.50× | 0.67× |",
		"| UDP request/response, 64 B (req/s) | n/a | 100 | n/a | 40.0 | 60.0 | 0.60× | n/a | 1.50× | n/a | 0.40× |",
		"| extra_fig | n/a | n/a | n/a | n/a | 7.00 | n/a | n/a | n/a | n/a | n/a |",
		"| &nbsp;&nbsp;… errors (count) | n/a | n/a | n/a | n/a | 3 (0–12) | n/a | n/a | n/a | n/a | n/a |",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("table lacks row\n%s\ngot:\n%s", want, got)
		}
	}
	if strings.Contains(got, "TCP throughput") {
		t.Errorf("table has a row for a figure that was never measured:\n%s", got)
	}
}

// Each data path gets its column and ratios only when the run measured it.
func TestRenderTableDataPaths(t *testing.T) {
	raw := "newconn_rps dnat 1 1000\nnewconn_rps kup 1 500\nnewconn_rps kupel 1 600\n"
	got := render(t, raw)
	for _, want := range []string{
		"| figure | kernel DNAT | kube-userspace-proxy, goroutines | kube-userspace-proxy, event loop (default) | goroutines ÷ DNAT | event loop ÷ DNAT |",
		"| HTTP new connection per request (req/s) | 1,000 | 500 | 600 | 0.50× | 0.60× |",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("table lacks row\n%s\ngot:\n%s", want, got)
		}
	}
}

// render is the table of raw samples.
func render(t *testing.T, raw string) string {
	t.Helper()
	data, order, err := readSamples(strings.NewReader(raw))
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	renderTable(&out, data, order)
	return out.String()
}

func TestReadSamplesRejectsBadLines(t *testing.T) {
	for _, in := range []string{"newconn_rps kup 1\n", "newconn_rps kup 1 fast\n"} {
		if _, _, err := readSamples(strings.NewReader(in)); err == nil {
			t.Errorf("readSamples(%q) succeeded", in)
		}
	}
}
