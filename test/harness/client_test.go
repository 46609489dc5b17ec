package harness_test

import (
	"net/netip"
	"testing"
	"time"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/test/harness"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/test/harness/netns"
)

// TestClientAndServeBackend asks an in-process backend inside a namespace
// over TCP and UDP, from a fixed UDP source port too, and waits until it is
// unserved after Close.
func TestClientAndServeBackend(t *testing.T) {
	netns.Require(t)
	ns := netns.New(t).NS("harness")
	addr := netip.MustParseAddrPort("127.0.0.1:8080")
	b := harness.ServeBackend(t, ns, "only", addr)
	cl := harness.Client{NS: ns}
	for _, proto := range []string{"tcp", "udp"} {
		if got := cl.MustAsk(t, proto, addr); got != "only" {
			t.Errorf("%s: answered by %q", proto, got)
		}
	}
	fixed := harness.Client{NS: ns, Src: addr.Addr(), SrcPort: 40053}
	for range 2 { // the same source port twice
		a, from, err := fixed.AskUDP(addr, time.Second)
		if err != nil || a.Remote != "127.0.0.1:40053" || from != addr {
			t.Errorf("fixed source port: answer %+v from %s, err %v", a, from, err)
		}
	}
	if _, err := fixed.AskTCP(addr, time.Second); err == nil {
		t.Error("TCP with a fixed source port was not refused")
	}
	if n := b.Answers(); n != 4 {
		t.Errorf("backend counted %d answers, want 4", n)
	}
	b.Close()
	cl.WaitUnserved(t, "tcp", addr, time.Now(), time.Second)
	if got := cl.String(); got != ns.Name {
		t.Errorf("String() = %q, want the namespace name", got)
	}
}

// TestFreshUDPSourcePorts: requests without SrcPort are new clients, so
// their source ports never repeat within a run of requests (bind(0)
// repeated one in 30 about once in 60 runs, and the proxy then saw the
// earlier client's session instead of a new one).
func TestFreshUDPSourcePorts(t *testing.T) {
	netns.Require(t)
	ns := netns.New(t).NS("harness")
	addr := netip.MustParseAddrPort("127.0.0.1:8080")
	harness.ServeBackend(t, ns, "only", addr)
	cl := harness.Client{NS: ns}
	seen := map[string]bool{}
	for range 500 {
		a, _, err := cl.AskUDP(addr, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if seen[a.Remote] {
			t.Fatalf("source %s used twice in %d requests", a.Remote, len(seen)+1)
		}
		seen[a.Remote] = true
	}
}
