package main

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/klog/v2"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/proxier/config"
)

// The Node's node IPs are its first InternalIP of each family, else its
// first ExternalIP (kube-proxy's GetNodeHostIPs), passing over addresses
// no interface here holds.
func TestNodeObjectIPs(t *testing.T) {
	a := netip.MustParseAddr
	local := func(ip netip.Addr) bool { return ip != a("10.0.0.9") && ip != a("fd00::9") }
	tests := []struct {
		name          string
		addrs         []netip.Addr // InternalIPs then ExternalIPs, as NodeInfo holds them
		want, notLoca []netip.Addr
	}{
		{"none", nil, nil, nil},
		{"first of each family", []netip.Addr{a("10.0.0.1"), a("10.0.0.2"), a("fd00::1"), a("fd00::2")}, []netip.Addr{a("10.0.0.1"), a("fd00::1")}, nil},
		{"IPv6 first", []netip.Addr{a("fd00::1"), a("10.0.0.1")}, []netip.Addr{a("fd00::1"), a("10.0.0.1")}, nil},
		{"not local passed over", []netip.Addr{a("10.0.0.9"), a("10.0.0.2"), a("fd00::9")}, []netip.Addr{a("10.0.0.2")}, []netip.Addr{a("10.0.0.9"), a("fd00::9")}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, notLocal := nodeObjectIPs(config.NodeInfo{Addresses: tt.addrs}, local)
			if !slices.Equal(got, tt.want) || !slices.Equal(notLocal, tt.notLoca) {
				t.Errorf("got %v (not local %v), want %v (%v)", got, notLocal, tt.want, tt.notLoca)
			}
		})
	}
}

// The Node's IPs stand in for the default route's, never for a flag:
// --node-ip and a specific --bind-address still win for their family, and
// --nodeport-addresses primary follows the same choice. Before, a node
// whose InternalIP was not on the default-route interface had its
// portals DNAT to the default route's address.
func TestNodeObjectIPsStandInForTheDefaultRoute(t *testing.T) {
	a := netip.MustParseAddr
	route4 := func() netip.Addr { return a("192.168.50.10") }
	route6 := func() netip.Addr { return a("fd00:50::10") }
	node := []netip.Addr{a("10.1.0.5"), a("fd01::5")}
	tests := []struct {
		name         string
		nodeIP, bind string
		want4, want6 string
	}{
		{"defaults", "", "0.0.0.0", "10.1.0.5", "fd01::5"},
		{"IPv4 --node-ip", "10.0.0.7", "0.0.0.0", "10.0.0.7", "fd01::5"},
		{"specific IPv4 bind", "", "10.0.0.8", "10.0.0.8", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v := &validated{bind: a(tt.bind), nodeObjectIPs: node}
			if tt.nodeIP != "" {
				v.nodeIP = a(tt.nodeIP)
			}
			str := func(x netip.Addr) string {
				if !x.IsValid() {
					return ""
				}
				return x.String()
			}
			if got4, got6 := str(nodeIPOf(v, false, route4)), str(nodeIPOf(v, true, route6)); got4 != tt.want4 || got6 != tt.want6 {
				t.Errorf("node IPs %q / %q, want %q / %q", got4, got6, tt.want4, tt.want6)
			}
		})
	}
	saved := defaultRoutes
	defer func() { defaultRoutes = saved }()
	defaultRoutes.v4, defaultRoutes.v6 = route4, route6
	v := &validated{nodePortPrimary: true, nodeObjectIPs: node}
	resolveNodePortAddresses(v)
	want := []netip.Prefix{netip.MustParsePrefix("10.1.0.5/32"), netip.MustParsePrefix("fd01::5/128")}
	if !slices.Equal(v.nodePortAddresses, want) {
		t.Errorf("--nodeport-addresses primary: %v, want %v", v.nodePortAddresses, want)
	}
}

// At start the proxy reads its Node (--hostname-override) from the API
// server: an InternalIP that an interface holds becomes the node IP; a
// missing Node or an API server that does not answer leaves the default
// route, within nodeLookupTimeout.
func TestReadNodeObjectIPsFromTheAPIServer(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/api/v1/nodes/node-a":
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write([]byte(`{"kind":"Node","apiVersion":"v1","metadata":{"name":"node-a"},
				"status":{"addresses":[{"type":"Hostname","address":"node-a"},{"type":"ExternalIP","address":"203.0.113.5"},{"type":"InternalIP","address":"10.1.0.5"}]}}`))
		case "/api/v1/nodes/slow":
			time.Sleep(2 * nodeLookupTimeout)
		default:
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusNotFound)
			_, _ = w.Write([]byte(`{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"NotFound","code":404}`))
		}
	}))
	defer srv.Close()
	local := func(netip.Addr) bool { return true }
	for _, tt := range []struct {
		node string
		want []netip.Addr
	}{
		{"node-a", []netip.Addr{netip.MustParseAddr("10.1.0.5")}}, // the InternalIP before the ExternalIP
		{"Node-A\n", []netip.Addr{netip.MustParseAddr("10.1.0.5")}},
		{"missing", nil},
		{"slow", nil},
	} {
		o := newOptions()
		o.master, o.hostnameOverride = srv.URL, tt.node
		v := &validated{}
		began := time.Now()
		client, err := apiClient(o)
		if err != nil {
			t.Fatal(err)
		}
		readNodeObjectIPs(context.Background(), client, o, v, local)
		if !slices.Equal(v.nodeObjectIPs, tt.want) {
			t.Errorf("Node %q: node IPs %v, want %v", tt.node, v.nodeObjectIPs, tt.want)
		}
		if took := time.Since(began); took > nodeLookupTimeout+time.Second {
			t.Errorf("Node %q: read took %s", tt.node, took)
		}
	}
}

// The Node's node IPs as the informer delivers them are compared with
// those the portals were built with, for the families no flag decides: a
// Node read at start whose address moved asks for a restart, once, as
// kube-proxy exits on a change of its node IPs. A Node without addresses
// (the state file's copy) or a family a flag decides asks for nothing; it
// was logged as a change, with newNodeIPs [].
func TestNodeIPsWatch(t *testing.T) {
	a := netip.MustParseAddr
	saved := defaultRoutes
	defer func() { defaultRoutes = saved }()
	defaultRoutes.v4 = func() netip.Addr { return a("192.168.50.10") }
	defaultRoutes.v6 = func() netip.Addr { return netip.Addr{} }
	local := func(netip.Addr) bool { return true }
	node := func(addrs ...string) config.NodeInfo {
		n := config.NodeInfo{Name: "node-a"}
		for _, s := range addrs {
			n.Addresses = append(n.Addresses, a(s))
		}
		return n
	}
	tests := []struct {
		name      string
		v         validated
		seen      []config.NodeInfo
		restarted int
	}{
		{"read at start, unchanged", validated{bind: a("0.0.0.0"), nodeObjectRead: true, nodeObjectIPs: []netip.Addr{a("10.1.0.5")}}, []config.NodeInfo{node("10.1.0.5"), node("10.1.0.5")}, 0},
		{"moved since start", validated{bind: a("0.0.0.0"), nodeObjectRead: true, nodeObjectIPs: []netip.Addr{a("10.1.0.5")}}, []config.NodeInfo{node("10.1.0.5"), node("10.1.0.9"), node("10.1.0.9"), node("10.1.0.10"), node("10.1.0.10")}, 1},
		// Once is not enough: an address gone for a moment must not cut
		// the node's Service traffic with a restart.
		{"moved for one update", validated{bind: a("0.0.0.0"), nodeObjectRead: true, nodeObjectIPs: []netip.Addr{a("10.1.0.5")}}, []config.NodeInfo{node("10.1.0.9"), node("10.1.0.5"), node("10.1.0.8"), node("10.1.0.5")}, 0},
		{"read at start without addresses, then given one", validated{bind: a("0.0.0.0"), nodeObjectRead: true}, []config.NodeInfo{node("10.1.0.5"), node("10.1.0.5")}, 1},
		// Read failed (the API server away): the default route is in use,
		// and a restart as the API server comes back would stop a proxy
		// serving its state file through the outage; logged only.
		{"not read at start", validated{bind: a("0.0.0.0")}, []config.NodeInfo{node("10.1.0.5")}, 0},
		{"read, the default route's", validated{bind: a("0.0.0.0"), nodeObjectRead: true}, []config.NodeInfo{node("192.168.50.10")}, 0},
		{"the state file's copy: no addresses", validated{bind: a("0.0.0.0"), nodeObjectRead: true, nodeObjectIPs: []netip.Addr{a("10.1.0.5")}}, []config.NodeInfo{node()}, 0},
		{"--node-ip decides IPv4", validated{bind: a("0.0.0.0"), nodeObjectRead: true, nodeIP: a("10.0.0.7")}, []config.NodeInfo{node("10.1.0.5")}, 0},
		{"a specific --bind-address decides", validated{bind: a("10.0.0.8"), nodeObjectRead: true}, []config.NodeInfo{node("10.1.0.5")}, 0},
		{"a family the node had no IP of", validated{bind: a("0.0.0.0"), nodeObjectRead: true, nodeObjectIPs: []netip.Addr{a("10.1.0.5")}}, []config.NodeInfo{node("10.1.0.5", "fd00::5")}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			restarted := 0
			w := newNodeIPsWatch(&tt.v, local, func(error) { restarted++ })
			w.recheck = 0 // updates alone (TestNodeIPsWatchLooksAgain)
			for _, n := range tt.seen {
				w.check(n)
			}
			if restarted != tt.restarted {
				t.Errorf("restart asked %d times, want %d", restarted, tt.restarted)
			}
		})
	}
	// Without rules (restart nil) it is only logged.
	newNodeIPsWatch(&validated{bind: a("0.0.0.0")}, local, nil).check(node("10.1.0.5"))
}

// A renumbering the kubelet reports in one update, with no other for
// minutes (nodeStatusReportFrequency), restarts the proxy once a second
// look at that update, recheck later, still shows it: it waited for a
// second update, while every Service of the node was DNATed to an address
// the node no longer had (the API-server sweep: 30 of 30 probes failed
// over 60 s). An update that takes the change back before then does not.
func TestNodeIPsWatchLooksAgain(t *testing.T) {
	a := netip.MustParseAddr
	node := func(addr string) config.NodeInfo {
		return config.NodeInfo{Name: "node-a", Addresses: []netip.Addr{a(addr)}}
	}
	for _, tt := range []struct {
		name      string
		seen      []string
		restarted int32
	}{
		{"renumbered in one update", []string{"10.1.0.9"}, 1},
		{"taken back before the second look", []string{"10.1.0.9", "10.1.0.5"}, 0},
		{"unchanged", []string{"10.1.0.5"}, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var restarted atomic.Int32
			v := validated{bind: a("0.0.0.0"), nodeObjectRead: true, nodeObjectIPs: []netip.Addr{a("10.1.0.5")}}
			w := newNodeIPsWatch(&v, func(netip.Addr) bool { return true }, func(error) { restarted.Add(1) })
			// The test looks again itself, once the updates are in: a
			// 20 ms timer fired between two updates on a loaded machine,
			// or not within the 100 ms the test waited (restart asked 0
			// times, want 1). TestNodeIPsWatchRechecksByItself runs the
			// timer.
			w.recheck = time.Hour
			for _, n := range tt.seen {
				w.check(node(n))
			}
			w.mu.Lock()
			armed := w.timer != nil && w.timer.Stop()
			w.mu.Unlock()
			if armed {
				w.lookAgain()
			}
			if got := restarted.Load(); got != tt.restarted {
				t.Errorf("restart asked %d times, want %d", got, tt.restarted)
			}
		})
	}
}

// The second look comes by itself, recheck after the update.
func TestNodeIPsWatchRechecksByItself(t *testing.T) {
	restarted := make(chan struct{}, 2)
	v := validated{bind: netip.MustParseAddr("0.0.0.0"), nodeObjectRead: true, nodeObjectIPs: []netip.Addr{netip.MustParseAddr("10.1.0.5")}}
	w := newNodeIPsWatch(&v, func(netip.Addr) bool { return true }, func(error) { restarted <- struct{}{} })
	w.recheck = 20 * time.Millisecond
	w.check(config.NodeInfo{Name: "node-a", Addresses: []netip.Addr{netip.MustParseAddr("10.1.0.9")}})
	select {
	case <-restarted:
	case <-time.After(10 * time.Second):
		t.Fatal("no restart 10 s after an update the 20 ms recheck should have confirmed")
	}
}

// Without the API server at start, the node IPs are those the state file
// kept of this Node (a restart during an outage), not the default route's;
// a file of another node gives none.
func TestReadNodeObjectIPsFromTheStateFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.json")
	kept := []netip.Addr{netip.MustParseAddr("10.1.0.5")}
	if err := config.WriteStateFile(path, config.State{Written: time.Now(), Node: "node-a", NodeIPs: kept}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		node string
		want []netip.Addr
	}{{"node-a", kept}, {"node-b", nil}} {
		o := newOptions()
		o.master, o.hostnameOverride, o.stateFile = "http://127.0.0.1:1", tc.node, path
		v := &validated{}
		client, err := apiClient(o)
		if err != nil {
			t.Fatal(err)
		}
		readNodeObjectIPs(context.Background(), client, o, v, func(netip.Addr) bool { return true })
		if !slices.Equal(v.nodeObjectIPs, tc.want) || v.nodeObjectRead != (tc.want != nil) {
			t.Errorf("%s: node IPs %v (read %v), want %v", tc.node, v.nodeObjectIPs, v.nodeObjectRead, tc.want)
		}
	}
}

// The start line of a family without a node IP says that the node's own
// connections to ClusterIPs need a route: without a default route (a
// namespace with lo only) they fail as network unreachable before the
// OUTPUT portal sees them, and the line said only that portals REDIRECT.
func TestNoNodeIPLineSaysClusterIPsNeedARoute(t *testing.T) {
	for _, tc := range []struct {
		name    string
		nodeIPs []netip.Addr
		want    string
	}{
		{"no family", nil, `"Portal rules enabled; no node IP (no default route, no --node-ip): portals REDIRECT, or DNAT to --bind-address when it names an address; the node's own connections to ClusterIPs need a route to them (a default route, or one covering the service range; with lo only, one with a source: ip route add 10.96.0.0/12 dev lo src 127.0.0.1), or fail as network unreachable`},
		{"IPv6 without", []netip.Addr{netip.MustParseAddr("192.0.2.10")}, `their portals REDIRECT, or DNAT to --bind-address when it names an address; the node's own connections to their ClusterIPs need a route to them`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			logs := captureKlog(t)
			logNodeIPs(&validated{}, tc.nodeIPs, true, true)
			klog.Flush()
			if !strings.Contains(logs.String(), tc.want) {
				t.Errorf("log lacks %q:\n%s", tc.want, logs)
			}
		})
	}
}
