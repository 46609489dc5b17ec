package e2e

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/test/harness/netns"
)

// TestNodePortOutsideAddressesRefused: with --nodeport-addresses naming
// only the node IP's subnet, a NodePort on another node address (the
// external link's) has no portal. The proxy still holds the port there, so
// no other process takes it, but a connection is refused at once; the
// listening claim used to complete the handshake and leave the client
// hanging; a UDP datagram is refused likewise. The NodePort on the node IP
// is served as usual.
func TestNodePortOutsideAddressesRefused(t *testing.T) {
	requireSuite(t)
	c := netns.NewCluster(t, netns.ClusterOptions{ClientIPsEach: 1})
	c.StartBackends(t, backendBin, backendPort)
	p := newProxy(t, c, "--nodeport-addresses", netip.PrefixFrom(c.NodeIP, 24).Masked().String())
	s := svc{name: "np", clusterIP: "10.96.0.10", endpoints: ips(c, 0, 1, 2), nodePorts: [2]int32{30080, 30053}}
	writeSvc(t, p.dir, s)
	p.Start(t, startWithin)
	inside := netip.AddrPortFrom(c.NodeIP, 30080)
	e := &env{c: c}
	e.external().WaitServed(t, "tcp", inside, time.Now(), startBudget)

	outside := netip.AddrPortFrom(c.NodeExternalIP, 30080)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	began := time.Now()
	conn, err := c.External.DialTCP(ctx, netip.Addr{}, outside)
	figure(t, "NodePort %s outside --nodeport-addresses: %v after %v", outside, err, time.Since(began).Round(time.Millisecond))
	if err == nil {
		conn.Close()
		t.Fatalf("connect to %s (outside --nodeport-addresses) completed a handshake; want refused", outside)
	}
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("connect to %s: %v, want connection refused", outside, err)
	}

	// The UDP NodePort stays held on that address too: no other process
	// can bind it there, and a datagram there is refused (port
	// unreachable), as where no socket holds the port; the held socket
	// took it and dropped it, and the client waited out its timeout.
	outsideUDP := netip.AddrPortFrom(c.NodeExternalIP, 30053)
	var udpErr error
	began = time.Now()
	err = c.External.Do(func() error {
		conn, err := net.DialUDP("udp4", nil, net.UDPAddrFromAddrPort(outsideUDP))
		if err != nil {
			return err
		}
		defer conn.Close()
		if _, err := conn.Write([]byte("query")); err != nil {
			return err
		}
		_ = conn.SetReadDeadline(time.Now().Add(2 * time.Second))
		_, udpErr = conn.Read(make([]byte, 64))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	figure(t, "UDP NodePort %s outside --nodeport-addresses: %v after %v", outsideUDP, udpErr, time.Since(began).Round(time.Millisecond))
	if !errors.Is(udpErr, syscall.ECONNREFUSED) {
		t.Fatalf("UDP to %s (outside --nodeport-addresses): %v, want connection refused", outsideUDP, udpErr)
	}
	err = c.Node.Do(func() error {
		pc, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(outsideUDP))
		if err == nil {
			pc.Close()
		}
		return err
	})
	figure(t, "binding UDP NodePort %s outside --nodeport-addresses: %v", outsideUDP, err)
	if !errors.Is(err, syscall.EADDRINUSE) {
		t.Fatalf("binding %s: %v, want address in use (the NodePort held)", outsideUDP, err)
	}
}
