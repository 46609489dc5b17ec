package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
)

// wrkResult is what run.sh keeps of one wrk run.
type wrkResult struct {
	rps         float64
	p50ms       float64
	p99ms       float64
	errors      int64 // socket errors of every kind plus non-2xx/3xx responses
	haveLatency bool
}

// runParseWrk reads wrk --latency output from the named file (or stdin) and
// prints "req/s p50_ms p99_ms errors".
func runParseWrk(args []string) error {
	fs := flag.NewFlagSet("wrk", flag.ExitOnError)
	_ = fs.Parse(args)
	r, err := openArg(fs.Args())
	if err != nil {
		return err
	}
	defer r.Close()
	res, err := parseWrk(r)
	if err != nil {
		return err
	}
	fmt.Printf("%.1f %.3f %.3f %d\n", res.rps, res.p50ms, res.p99ms, res.errors)
	return nil
}

func openArg(args []string) (io.ReadCloser, error) {
	if len(args) == 0 || args[0] == "-" {
		return io.NopCloser(os.Stdin), nil
	}
	return os.Open(args[0])
}

func parseWrk(r io.Reader) (wrkResult, error) {
	var res wrkResult
	haveRPS := false
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		switch {
		case len(f) == 2 && f[0] == "Requests/sec:":
			v, err := strconv.ParseFloat(f[1], 64)
			if err != nil {
				return res, fmt.Errorf("requests/sec %q: %w", f[1], err)
			}
			res.rps, haveRPS = v, true
		case len(f) == 2 && (f[0] == "50%" || f[0] == "99%"):
			ms, err := wrkDurationMS(f[1])
			if err != nil {
				return res, err
			}
			if f[0] == "50%" {
				res.p50ms = ms
			} else {
				res.p99ms, res.haveLatency = ms, true
			}
		case len(f) >= 3 && f[0] == "Socket" && f[1] == "errors:":
			// Socket errors: connect 0, read 0, write 0, timeout 0
			for i := 2; i+1 < len(f); i += 2 {
				n, err := strconv.ParseInt(strings.TrimSuffix(f[i+1], ","), 10, 64)
				if err != nil {
					return res, fmt.Errorf("socket errors %q: %w", sc.Text(), err)
				}
				res.errors += n
			}
		case len(f) == 5 && f[0] == "Non-2xx":
			n, err := strconv.ParseInt(f[4], 10, 64)
			if err != nil {
				return res, fmt.Errorf("non-2xx %q: %w", sc.Text(), err)
			}
			res.errors += n
		}
	}
	if err := sc.Err(); err != nil {
		return res, err
	}
	if !haveRPS {
		return res, errors.New("no Requests/sec line: wrk failed")
	}
	return res, nil
}

// wrkDurationMS converts wrk's "812.00us", "1.23ms", "2.00s", "1.00m".
func wrkDurationMS(s string) (float64, error) {
	for _, u := range []struct {
		suffix string
		ms     float64
	}{{"us", 0.001}, {"ms", 1}, {"s", 1000}, {"m", 60000}, {"h", 3600000}} {
		if num, ok := strings.CutSuffix(s, u.suffix); ok {
			// "ms" also ends in "s": only accept a clean number.
			v, err := strconv.ParseFloat(num, 64)
			if err != nil {
				continue
			}
			return v * u.ms, nil
		}
	}
	return 0, fmt.Errorf("wrk duration %q: unknown unit", s)
}

// iperfResult is the receiver side of one iperf3 run.
type iperfResult struct {
	gbps  float64
	bytes int64
}

// runParseIperf reads iperf3 -J output and prints "Gbit/s bytes".
func runParseIperf(args []string) error {
	fs := flag.NewFlagSet("iperf", flag.ExitOnError)
	_ = fs.Parse(args)
	r, err := openArg(fs.Args())
	if err != nil {
		return err
	}
	defer r.Close()
	res, err := parseIperf(r)
	if err != nil {
		return err
	}
	fmt.Printf("%.3f %d\n", res.gbps, res.bytes)
	return nil
}

func parseIperf(r io.Reader) (iperfResult, error) {
	var doc struct {
		Error string `json:"error"`
		End   struct {
			SumReceived struct {
				Bytes         int64   `json:"bytes"`
				BitsPerSecond float64 `json:"bits_per_second"`
			} `json:"sum_received"`
		} `json:"end"`
	}
	if err := json.NewDecoder(r).Decode(&doc); err != nil {
		return iperfResult{}, fmt.Errorf("iperf3 JSON: %w", err)
	}
	if doc.Error != "" {
		return iperfResult{}, fmt.Errorf("iperf3: %s", doc.Error)
	}
	if doc.End.SumReceived.Bytes == 0 {
		return iperfResult{}, errors.New("iperf3 received nothing")
	}
	return iperfResult{gbps: doc.End.SumReceived.BitsPerSecond / 1e9, bytes: doc.End.SumReceived.Bytes}, nil
}
