// Command client asks a service N times, each time over a new TCP connection
// (or from a new UDP source port), and prints which backend answered: one line
// per attempt ("NAME" or "ERR reason"), then a summary line
// "COUNTS name=count ... errors=N". It speaks the backend tool's protocol.
//
// Example, from inside a namespace:
//
//	ip netns exec kup-pod1-ab12cd client -addr 10.96.0.10:80 -n 30
package main

import (
	"flag"
	"fmt"
	"net"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/test/harness/backend"
)

func main() {
	addr := flag.String("addr", "", "service IP:port")
	proto := flag.String("proto", "tcp", "tcp or udp")
	n := flag.Int("n", 1, "number of attempts, each a new connection / source port")
	src := flag.String("src", "", "source IP to bind (optional)")
	timeout := flag.Duration("timeout", 2*time.Second, "per-attempt timeout")
	gap := flag.Duration("gap", 0, "pause between attempts")
	flag.Parse()
	if *addr == "" {
		fmt.Fprintln(os.Stderr, "client: -addr is required")
		os.Exit(2)
	}
	counts := map[string]int{}
	errs := 0
	for i := 0; i < *n; i++ {
		if i > 0 {
			time.Sleep(*gap)
		}
		name, err := ask(*proto, *src, *addr, *timeout)
		if err != nil {
			errs++
			fmt.Printf("ERR %v\n", err)
			continue
		}
		counts[name]++
		fmt.Println(name)
	}
	names := make([]string, 0, len(counts))
	for k := range counts {
		names = append(names, k)
	}
	sort.Strings(names)
	var parts []string
	for _, k := range names {
		parts = append(parts, fmt.Sprintf("%s=%d", k, counts[k]))
	}
	fmt.Printf("COUNTS %s errors=%d\n", strings.Join(parts, " "), errs)
	if errs > 0 {
		os.Exit(1)
	}
}

func ask(proto, src, addr string, timeout time.Duration) (string, error) {
	d := net.Dialer{Timeout: timeout}
	if src != "" {
		ip := net.ParseIP(src)
		if proto == "udp" {
			d.LocalAddr = &net.UDPAddr{IP: ip}
		} else {
			d.LocalAddr = &net.TCPAddr{IP: ip}
		}
	}
	c, err := d.Dial(proto, addr)
	if err != nil {
		return "", err
	}
	a, err := backend.AskTCP(c, timeout) // a connected UDP socket speaks the same line protocol
	return a.Backend, err
}
