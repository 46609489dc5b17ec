package main

import (
	"errors"
	"net/netip"
	"slices"
	"testing"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/iptables"
)

// --iptables=false over the portals an earlier run left: every Service
// was refused (the portals send it to the old proxy ports) while /healthz
// said 200, and nothing was logged. A family holding such portals is now
// warned about; a clean one, or one without iptables, is not.
func TestWarnLeftoverPortals(t *testing.T) {
	v4, v6 := iptables.NewFakeRunner(iptables.IPv4), iptables.NewFakeRunner(iptables.IPv6)
	newRunner := func(f iptables.Family) (iptables.Runner, error) {
		if f == iptables.IPv6 {
			return v6, nil
		}
		return v4, nil
	}
	if said := warnLeftoverPortals(newRunner); len(said) != 0 {
		t.Errorf("clean tables: warned for %v", said)
	}
	cfg := iptables.Config{Family: iptables.IPv4, BindAddress: netip.IPv4Unspecified(), NodeIP: netip.MustParseAddr("192.168.1.10")}
	portals := []iptables.Portal{{Name: "default/web:http", Protocol: iptables.TCP, IP: netip.MustParseAddr("10.96.0.10"), Port: 80, ProxyPort: 40001}}
	if err := iptables.New(v4, cfg).Sync(portals); err != nil {
		t.Fatal(err)
	}
	if said := warnLeftoverPortals(newRunner); !slices.Equal(said, []string{iptables.IPv4.String()}) {
		t.Errorf("IPv4 portals left: warned for %v, want IPv4 only", said)
	}
	noIPv6 := func(f iptables.Family) (iptables.Runner, error) {
		if f == iptables.IPv6 {
			return nil, errors.New("ip6tables: not found")
		}
		return v4, nil
	}
	if said := warnLeftoverPortals(noIPv6); !slices.Equal(said, []string{iptables.IPv4.String()}) {
		t.Errorf("without ip6tables: warned for %v, want IPv4 only", said)
	}
}
