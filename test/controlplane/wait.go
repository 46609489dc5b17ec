package controlplane

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"time"
)

// waitUntil polls ok every 100 ms until it holds, p exits, or timeout passes.
func waitUntil(p *process, timeout time.Duration, ok func() bool) error {
	deadline := time.Now().Add(timeout)
	for {
		if ok() {
			return nil
		}
		if !p.running() {
			return p.exitError()
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not ready after %v\n%s", p.name, timeout, tailFile(p.logPath, 30))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// httpOK reports whether GET url answers 200.
func httpOK(c *http.Client, url string) bool {
	resp, err := c.Get(url)
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode == http.StatusOK
}

// freePorts returns n distinct loopback TCP ports that were free a moment ago; the
// listeners are held until all are chosen so the kernel cannot hand one out twice.
func freePorts(n int) ([]int, error) {
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		defer l.Close()
		_, port, _ := net.SplitHostPort(l.Addr().String())
		p, _ := strconv.Atoi(port)
		ports = append(ports, p)
	}
	return ports, nil
}
