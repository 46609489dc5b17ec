package faults

import (
	"encoding/json"
	"io"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/relay"
)

// toxic parses one toxic as the annotation or the API would and fills its
// defaults.
func toxic(t testing.TB, js string) Toxic {
	t.Helper()
	var tx Toxic
	if err := json.Unmarshal([]byte(js), &tx); err != nil {
		t.Fatalf("toxic %s: %v", js, err)
	}
	if err := tx.Normalize(); err != nil {
		t.Fatalf("toxic %s: %v", js, err)
	}
	return tx
}

// declared builds a table with one port carrying toxics as its annotation.
func declared(t testing.TB, seed int64, maxActive int, protocol string, toxics ...string) (*Table, *Port) {
	t.Helper()
	tbl := NewTable(seed, maxActive, nil)
	p := tbl.Port("default.web.http", protocol)
	var txs []Toxic
	for _, js := range toxics {
		txs = append(txs, toxic(t, js))
	}
	p.SetDeclared(txs)
	return tbl, p
}

var client1 = netip.MustParseAddr("10.0.0.1")

// session1 is client1 on a port: a UDP session, as Send takes it.
var session1 = netip.AddrPortFrom(client1, 40001)

// faultedSet accepts n connections from client and returns which were
// faulted (Accept returned a Conn), releasing each.
func faultedSet(p *Port, n int, client netip.Addr) []bool {
	out := make([]bool, n)
	for i := range out {
		if c := p.Accept(client); c != nil {
			out[i] = true
			c.Done()
		}
	}
	return out
}

// tcpPair returns both ends of a loopback TCP connection.
func tcpPair(t testing.TB) (a, b *net.TCPConn) {
	t.Helper()
	ln, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	a, err = net.DialTCP("tcp", nil, ln.Addr().(*net.TCPAddr))
	if err != nil {
		t.Fatal(err)
	}
	b, err = ln.AcceptTCP()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, b
}

// proxied accepts one connection on p as the proxier does and relays it
// between two loopback pairs; it returns the client's and the backend's
// outer ends and a channel closed when the relay returned. A refused
// connection returns nil ends.
func proxied(t testing.TB, p *Port, from netip.Addr) (client, backend *net.TCPConn, done chan struct{}) {
	t.Helper()
	return proxiedWith(t, p, from, relay.Options{})
}

// proxiedWith is proxied with the relay's bounds in o, wired as the
// proxier wires them; setup, if any, sees the proxy's own two sockets
// first.
func proxiedWith(t testing.TB, p *Port, from netip.Addr, o relay.Options, setup ...func(proxyClient, proxyBackend *net.TCPConn)) (client, backend *net.TCPConn, done chan struct{}) {
	t.Helper()
	done = make(chan struct{})
	fc := p.Accept(from)
	if fc != nil && fc.Refuse {
		fc.Done()
		close(done)
		return nil, nil, done
	}
	client, proxyClient := tcpPair(t)
	proxyBackend, backend := tcpPair(t)
	for _, f := range setup {
		f(proxyClient, proxyBackend)
	}
	if fc != nil {
		o.Upstream, o.Downstream = fc.Upstream, fc.Downstream
		o.OnAbort = fc.Abort
		fc.SetBounds(o.HalfCloseTimeout, o.WriteTimeout)
		fc.Attach(proxyClient, proxyBackend)
	}
	go func() {
		defer close(done)
		relay.TCP(proxyClient, proxyBackend, o)
		if fc != nil {
			fc.Done()
		}
	}()
	return client, backend, done
}

func mustAddr(s string) netip.Addr { return netip.MustParseAddr(s) }

// relayEnds waits for the relay proxied started to end.
func relayEnds(t testing.TB, done <-chan struct{}) {
	t.Helper()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("the relay did not end")
	}
}

// oneByteDelay has backend send one byte and returns how long the client
// took to get it: the delay the toxics downstream gave it.
func oneByteDelay(t testing.TB, client, backend *net.TCPConn) time.Duration {
	t.Helper()
	start := time.Now()
	if _, err := backend.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	_ = client.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.ReadFull(client, make([]byte, 1)); err != nil {
		t.Fatal(err)
	}
	return time.Since(start)
}
