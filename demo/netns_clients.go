package demo

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"time"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/proxier"
)

func nodeIP() netip.Addr { return netip.AddrFrom4(demoNodeIP) }

// nsClients opens the clients' sockets inside the client namespace, from
// 10.77.0.n.
type nsClients struct{ ns netNS }

func (nsClients) addr(c client) netip.Addr {
	return netip.AddrFrom4([4]byte{demoClientNet[0], demoClientNet[1], demoClientNet[2], byte(c)})
}

func (n nsClients) dialTCP(ctx context.Context, from netip.Addr, to netip.AddrPort) (net.Conn, error) {
	var c net.Conn
	err := n.ns.do(func() error {
		d := net.Dialer{LocalAddr: net.TCPAddrFromAddrPort(netip.AddrPortFrom(from, 0)), Timeout: ioTimeout, KeepAlive: -1}
		var err error
		c, err = d.DialContext(ctx, "tcp4", to.String())
		return err
	})
	return c, err
}

func (n nsClients) listenUDP(from netip.Addr) (*net.UDPConn, error) {
	var c *net.UDPConn
	err := n.ns.do(func() error {
		var err error
		c, err = net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(from, 0)))
		return err
	})
	return c, err
}

// httpView reads the proxy process's /debug/services, on its metrics
// address inside the node namespace, as a user would with curl there.
type httpView struct {
	client *http.Client
	url    string
}

func newHTTPView(node netNS, metricsAddr string) httpView {
	tr := &http.Transport{
		// Connections are opened in the node namespace and kept alive, so
		// polling costs no thread per request.
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			var c net.Conn
			err := node.do(func() error {
				var d net.Dialer
				var err error
				c, err = d.DialContext(ctx, network, addr)
				return err
			})
			return c, err
		},
		MaxIdleConns: 2,
	}
	return httpView{client: &http.Client{Transport: tr, Timeout: 5 * time.Second}, url: "http://" + metricsAddr + "/debug/services"}
}

// DebugServices is nil while the proxy does not answer (the demo's waits
// keep polling).
func (v httpView) DebugServices() []proxier.DebugServicePort {
	resp, err := v.client.Get(v.url)
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	var out []proxier.DebugServicePort
	if resp.StatusCode != http.StatusOK || json.NewDecoder(resp.Body).Decode(&out) != nil {
		return nil
	}
	return out
}

func (v httpView) ProxyPort(servicePort string) (int, bool) {
	for _, s := range v.DebugServices() {
		if s.ServicePort != servicePort {
			continue
		}
		if ap, err := netip.ParseAddrPort(s.ProxyAddress); err == nil {
			return int(ap.Port()), true
		}
		_, port, _ := net.SplitHostPort(s.ProxyAddress)
		n, err := strconv.Atoi(port)
		return n, err == nil
	}
	return 0, false
}

func (v httpView) close() { v.client.CloseIdleConnections() }
