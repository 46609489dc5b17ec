package proxier

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/test/harness/netns"
)

// TestKernelProxyPortsAvoidTheEphemeralRange opens real sockets (TCP and
// UDP, kernel ports by default) and checks each proxy port against the
// ephemeral range of the namespace it lives in: the host's, and a namespace
// whose range differs (the range is per network namespace, so the proxier
// must read it where its sockets are).
func TestKernelProxyPortsAvoidTheEphemeralRange(t *testing.T) {
	check := func(t *testing.T, do func(func() error) error) {
		var kp kernelPorts
		var p *Proxier
		err := do(func() (err error) {
			if kp, err = readKernelPortsFromProc(); err != nil {
				return err
			}
			p = newTestProxier(t, Options{})
			for i := range 20 {
				proto := v1.ProtocolTCP
				if i%2 == 1 {
					proto = v1.ProtocolUDP
				}
				p.OnServiceAdd(makeService(fmt.Sprintf("s%d", i), withClusterIP(fmt.Sprintf("10.96.0.%d", i+1)), withProtocol(proto)))
			}
			p.Sync()
			return nil
		})
		if err != nil {
			t.Skipf("cannot read the ephemeral range: %v", err)
		}
		eph := kp.Ephemeral
		ports := p.DebugServices()
		if len(ports) != 20 {
			t.Fatalf("%d service ports open, want 20", len(ports))
		}
		for _, sp := range ports {
			_, portStr, _ := strings.Cut(sp.ProxyAddress, ":")
			port, _ := strconv.Atoi(portStr)
			if port >= eph.Base && port < eph.Base+eph.Size {
				t.Errorf("%s listens on %d, inside the ephemeral range %s", sp.ServicePort, port, eph)
			}
			if port >= 30000 && port <= 32767 {
				t.Errorf("%s listens on %d, inside the NodePort range", sp.ServicePort, port)
			}
		}
	}
	t.Run("host namespace", func(t *testing.T) {
		check(t, func(fn func() error) error { return fn() })
	})
	t.Run("own namespace", func(t *testing.T) {
		if os.Geteuid() != 0 {
			t.Skip("needs root for a network namespace")
		}
		netns.Require(t, "ip")
		ns := netns.New(t).NS("eph")
		ns.MustIP("link", "set", "lo", "up")
		// A range unlike the host's: everything above 20000 is ephemeral.
		ns.Sysctl("net.ipv4.ip_local_port_range", "20000 65535")
		check(t, ns.Do)
	})
}
