// Command backend runs one test backend (test/harness/backend.Server) as its
// own process: it listens on one address for TCP and UDP and answers every
// request with its own name, so a test can tell which backend a proxied
// connection reached. The protocol is documented on backend.Server.
//
// When both listeners are up it prints "READY NAME ADDR" on stdout.
package main

import (
	"flag"
	"fmt"
	"log"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/test/harness/backend"
)

func main() {
	name := flag.String("name", "backend", "name sent back in every answer")
	addr := flag.String("addr", "127.0.0.1:8080", "IP:port to listen on, TCP and UDP")
	noUDP := flag.Bool("no-udp", false, "listen on TCP only")
	udpDelay := flag.Duration("udp-delay", 0, "hold each UDP reply back this long, as a slow backend answers")
	flag.Parse()

	s, err := backend.Listen(*name, backend.Ask, *addr, *noUDP, log.Printf)
	if err != nil {
		log.Fatal(err)
	}
	s.SetUDPDelay(*udpDelay)
	fmt.Printf("READY %s %s\n", *name, *addr)
	select {} // serve until killed
}
