package main

import (
	"strings"
	"testing"
)

const wrkSample = `Running 8s test @ http://10.96.0.20/
  2 threads and 64 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency     1.23ms  456.00us  12.34ms   80.00%
    Req/Sec    20.00k     1.00k   25.00k    70.00%
  Latency Distribution
     50%  812.00us
     75%    1.50ms
     90%    2.00ms
     99%    1.20s
  320000 requests in 8.00s, 40.00MB read
  Socket errors: connect 3, read 2, write 0, timeout 1
  Non-2xx or 3xx responses: 5
Requests/sec:  40000.50
Transfer/sec:      5.00MB
`

func TestParseWrk(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    wrkResult
		wantErr bool
	}{
		{"full", wrkSample, wrkResult{rps: 40000.5, p50ms: 0.812, p99ms: 1200, errors: 11, haveLatency: true}, false},
		{"no errors lines", "     50%    1.00ms\n     99%    2.00ms\nRequests/sec:  10.00\n",
			wrkResult{rps: 10, p50ms: 1, p99ms: 2, haveLatency: true}, false},
		{"wrk failed", "unable to connect to 10.96.0.20:80 Connection refused\n", wrkResult{}, true},
		{"bad unit", "     50%    1.00xs\nRequests/sec:  10.00\n", wrkResult{}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseWrk(strings.NewReader(tt.in))
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v, wantErr %v", err, tt.wantErr)
			}
			if !tt.wantErr && !approxWrk(got, tt.want) {
				t.Errorf("got %+v, want %+v", got, tt.want)
			}
		})
	}
}

func approxWrk(a, b wrkResult) bool {
	near := func(x, y float64) bool { d := x - y; return d < 1e-9 && d > -1e-9 }
	return near(a.rps, b.rps) && near(a.p50ms, b.p50ms) && near(a.p99ms, b.p99ms) &&
		a.errors == b.errors && a.haveLatency == b.haveLatency
}

func TestParseIperf(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    iperfResult
		wantErr bool
	}{
		{"ok", `{"start":{},"end":{"sum_sent":{"bytes":9},"sum_received":{"bytes":12500000000,"bits_per_second":12.5e9}}}`,
			iperfResult{gbps: 12.5, bytes: 12500000000}, false},
		{"error", `{"start":{},"end":{},"error":"unable to connect to server: Connection refused"}`, iperfResult{}, true},
		{"nothing received", `{"end":{"sum_received":{"bytes":0}}}`, iperfResult{}, true},
		{"not json", `iperf3: error`, iperfResult{}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseIperf(strings.NewReader(tt.in))
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v, wantErr %v", err, tt.wantErr)
			}
			if got != tt.want {
				t.Errorf("got %+v, want %+v", got, tt.want)
			}
		})
	}
}
