// Command benchtool is the Go half of test/bench/run.sh: the HTTP server and
// UDP echo that the backends run, a UDP request/response load generator, a
// holder of idle proxied connections, parsers for wrk and iperf3 output, and
// the renderer of the results table. Every subcommand only talks to the
// addresses it is given; run.sh gives it addresses inside the namespaces it
// created.
package main

import (
	"fmt"
	"os"
	"sort"
)

// commands maps each subcommand to its entry point; each parses its own flags.
var commands = map[string]func(args []string) error{
	"http":     runHTTP,
	"udp-echo": runUDPEcho,
	"udp-load": runUDPLoad,
	"idle":     runIdle,
	"wrk":      runParseWrk,
	"iperf":    runParseIperf,
	"table":    runTable,
}

func main() {
	if len(os.Args) < 2 || commands[os.Args[1]] == nil {
		names := make([]string, 0, len(commands))
		for n := range commands {
			names = append(names, n)
		}
		sort.Strings(names)
		fmt.Fprintf(os.Stderr, "usage: benchtool COMMAND [flags]; commands: %v\n", names)
		os.Exit(2)
	}
	if err := commands[os.Args[1]](os.Args[2:]); err != nil {
		fmt.Fprintf(os.Stderr, "benchtool %s: %v\n", os.Args[1], err)
		os.Exit(1)
	}
}
