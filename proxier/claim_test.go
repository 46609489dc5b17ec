package proxier

import (
	"net"
	"strconv"
	"testing"

	v1 "k8s.io/api/core/v1"
)

// A NodePort is held open while its Service exists, so no other process can
// bind it and silently lose its traffic to our portal rules.
func TestNodePortIsClaimed(t *testing.T) {
	for _, proto := range []v1.Protocol{v1.ProtocolTCP, v1.ProtocolUDP} {
		t.Run(string(proto), func(t *testing.T) {
			network := map[v1.Protocol]string{v1.ProtocolTCP: "tcp", v1.ProtocolUDP: "udp"}[proto]
			port := freePortFor(t, network)
			p := newTestProxier(t, Options{ClaimNodePorts: true})
			svc := makeService("web", withProtocol(proto), withNodePort(int32(port)))
			p.OnServiceAdd(svc)
			p.Sync()
			if err := bindable(network, port); err == nil {
				t.Fatalf("%s NodePort %d could be bound by another process", network, port)
			}
			p.OnServiceDelete(svc)
			p.Sync()
			if err := bindable(network, port); err != nil {
				t.Fatalf("NodePort %d still held after the Service was deleted: %v", port, err)
			}
		})
	}
}

func freePortFor(t *testing.T, network string) int {
	t.Helper()
	if network == "tcp" {
		ln, err := net.Listen("tcp", ":0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		return ln.Addr().(*net.TCPAddr).Port
	}
	pc, err := net.ListenPacket("udp", ":0")
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	return pc.LocalAddr().(*net.UDPAddr).Port
}

func bindable(network string, port int) error {
	addr := net.JoinHostPort("", strconv.Itoa(port))
	if network == "tcp" {
		ln, err := net.Listen(network, addr)
		if err == nil {
			ln.Close()
		}
		return err
	}
	pc, err := net.ListenPacket(network, addr)
	if err == nil {
		pc.Close()
	}
	return err
}
