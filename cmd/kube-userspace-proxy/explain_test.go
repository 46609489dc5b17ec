package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/iptables"
)

var update = flag.Bool("update", false, "rewrite testdata/explain.golden from the current output")

// explain on examples/manifests prints exactly testdata/explain.golden:
// the rules come from the iptables renderer, so a change there shows here.
// Refresh with: go test ./cmd/kube-userspace-proxy -run TestExplainGolden -update
func TestExplainGolden(t *testing.T) {
	// No privilege is needed: explain must not even ask.
	saved := canProgramIptables
	canProgramIptables = func() bool { t.Error("explain asked for iptables privileges"); return false }
	defer func() { canProgramIptables = saved }()

	var out bytes.Buffer
	code := explain(t.Context(), []string{"--manifests", "../../examples/manifests", "--node-ip", "192.168.50.10",
		"--hostname-override", "node-a"}, &out)
	if code != 0 {
		t.Fatalf("exit %d", code)
	}
	golden := filepath.Join("testdata", "explain.golden")
	if *update {
		if err := os.WriteFile(golden, out.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (run with -update to create it)", err)
	}
	if !bytes.Equal(out.Bytes(), want) {
		t.Errorf("explain output differs from %s (run with -update if the change is intended):\n%s", golden, out.String())
	}
}

// The flags shape the rules as they would for the proxy: a bind address
// means DNAT to it, a port range gives ports from it, --nodeport-addresses
// limits node ports.
func TestExplainFollowsProxyFlags(t *testing.T) {
	var out bytes.Buffer
	code := explain(t.Context(), []string{"--manifests", "../../examples/manifests", "--bind-address", "192.168.50.10",
		"--proxy-port-range", "30500-30509", "--nodeport-addresses", "192.168.50.0/24"}, &out)
	if code != 0 {
		t.Fatalf("exit %d", code)
	}
	for _, want := range []string{
		"Proxy sockets listen on 192.168.50.10 (--bind-address)",
		"--proxy-port-range 30500-30509",
		"proxy socket:     192.168.50.10:30500 (example port)",
		"-A KUBE-PORTALS-CONTAINER -d 10.96.0.11/32 -p tcp -m comment --comment \"default/sticky:http\" -m tcp --dport 80 -j DNAT --to-destination 192.168.50.10:30500",
		"-A KUBE-NODEPORT-CONTAINER -d 192.168.50.0/24 -p tcp",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
}

// --nodeport-addresses primary (kube-proxy's value) limits NodePorts to the
// node IP of each family: --node-ip here for IPv4; it used to be refused as
// not a CIDR.
func TestExplainNodePortAddressesPrimary(t *testing.T) {
	var out bytes.Buffer
	code := explain(t.Context(), []string{"--manifests", "../../examples/manifests", "--node-ip", "192.168.50.10",
		"--nodeport-addresses", "primary"}, &out)
	if code != 0 {
		t.Fatalf("exit %d", code)
	}
	if want := "-A KUBE-NODEPORT-CONTAINER -d 192.168.50.10/32 -p tcp"; !strings.Contains(out.String(), want) {
		t.Errorf("output lacks %q:\n%s", want, out.String())
	}
}

// A --proxy-port-range smaller than the service ports: the first in name
// order get its ports, the rest say they would not be served. The plan's
// numbering ignored the range's end (web-nodeport got 45001 of a one-port
// range) while the allocator refused others at random, printed with a
// blank socket and "none ready" endpoints.
func TestExplainPortRangeTooSmall(t *testing.T) {
	var out bytes.Buffer
	code := explain(t.Context(), []string{"--manifests", "../../examples/manifests", "--proxy-port-range", "45000"}, &out)
	if code != 0 {
		t.Fatalf("exit %d", code)
	}
	got := out.String()
	outputHas(t, got,
		"== default/sticky:http (TCP) ==\nservice address:  10.96.0.11:80\nproxy socket:     0.0.0.0:45000 (example port)",
		"== default/web:http (TCP) ==\nservice address:  10.96.0.10:80\nproxy socket:     none: proxy port range exhausted: --proxy-port-range holds 1",
	)
	if strings.Contains(got, ":45001") {
		t.Errorf("a port outside --proxy-port-range 45000:\n%s", got)
	}
}

// explain follows the proxy on a --bind-address of one family: the other
// family gets no rules, a dual-stack Service is explained in the bind
// address's family and an IPv6-only one is not served. It says so, in
// the header as the proxy's log does and for each Service: it listed the
// IPv6 ClusterIP as a service address, said "IPv6 clients the IPv6 ones"
// and left the IPv6-only Service out without a word.
func TestExplainBindAddressOfOneFamily(t *testing.T) {
	got := explainManifests(t, `apiVersion: v1
kind: Service
metadata: {name: ds, namespace: default}
spec:
  type: NodePort
  clusterIPs: [10.96.0.20, "fd36:96::20"]
  ports: [{name: http, port: 80, nodePort: 30100}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: ds-4, namespace: default, labels: {kubernetes.io/service-name: ds}}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints: [{addresses: [10.1.0.1]}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: ds-6, namespace: default, labels: {kubernetes.io/service-name: ds}}
addressType: IPv6
ports: [{name: http, port: 8080}]
endpoints: [{addresses: ["fd00:1::1"]}]
---
apiVersion: v1
kind: Service
metadata: {name: six, namespace: default}
spec:
  clusterIPs: ["fd36:96::10"]
  ports: [{name: http, port: 80}]
`, "--bind-address", "10.236.1.1")
	if !strings.Contains(got, "-d 10.96.0.20/32") || strings.Contains(got, "fd36:96::20/128") || strings.Contains(got, "== default/six:http") {
		t.Errorf("want IPv4 rules of default/ds only:\n%s", got)
	}
	outputHas(t, got,
		"--bind-address names one address: the other family's (IPv6) Services get no portals; dual-stack\n"+
			"ones are served in IPv4 only.\n",
		"service address:  10.96.0.20:80, port 30100 of the node's IPv4 addresses (NodePort)\n"+
			"not served:       [fd36:96::20]:80 (IPv6, which --bind-address 10.236.1.1 does not serve: no rule)\n",
		"IPv4 clients take the IPv4 ones; the Service's IPv6 endpoints are not used (IPv6 is not served)\n",
		"== default/six (no service port to proxy) ==\n"+
			"warnings:         not served: its addresses are IPv6, which --bind-address 10.236.1.1 does not serve\n",
	)
	if strings.Contains(got, "IPv6 clients") {
		t.Errorf("IPv6 clients described as served:\n%s", got)
	}
	// --iptables=false: the proxy has no portals of either family to leave
	// out, and serves every port on its socket (explain left the IPv6-only
	// Service out).
	got = explainManifests(t, `apiVersion: v1
kind: Service
metadata: {name: six, namespace: default}
spec:
  clusterIPs: ["fd36:96::10"]
  ports: [{name: http, port: 80}]
`, "--iptables=false", "--bind-address", "127.0.0.1")
	outputHas(t, got, "== default/six:http (TCP) ==\n")
	if strings.Contains(got, "not served") || strings.Contains(got, "names one address") {
		t.Errorf("--iptables=false:\n%s", got)
	}
}

func TestExplainBadInput(t *testing.T) {
	for _, tc := range []struct {
		args []string
		code int
	}{
		{[]string{"--no-such-flag"}, exitUsage},
		{[]string{"--manifests", "x", "extra"}, exitUsage},
		{[]string{"--manifests", "x", "--bind-address", "nope"}, exitUsage},
		{[]string{"--manifests", filepath.Join(t.TempDir(), "missing")}, exitUsage},
	} {
		var out bytes.Buffer
		if code := explain(t.Context(), tc.args, &out); code != tc.code {
			t.Errorf("explain %q: exit %d, want %d", tc.args, code, tc.code)
		}
	}
}

// A negative --timeout is bad input, as every other negative duration
// flag is (exit 2, the flag named). It read as "without limit (--timeout
// 0)": explain then waited for an absent API server until interrupted.
func TestExplainNegativeTimeout(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	var code int
	stderr := capture(t, &os.Stderr, func() {
		code = explain(ctx, []string{"--master", "http://127.0.0.1:1", "--timeout", "-1s"}, io.Discard)
	})
	if code != exitUsage || !strings.Contains(stderr, "--timeout must not be negative, got -1s") {
		t.Errorf("explain --timeout -1s: exit %d, stderr:\n%s\nwant exit %d naming --timeout", code, stderr, exitUsage)
	}
}

// An empty directory explains that there is nothing to proxy.
func TestExplainNothing(t *testing.T) {
	var out bytes.Buffer
	if code := explain(t.Context(), []string{"--manifests", t.TempDir()}, &out); code != 0 {
		t.Fatalf("exit %d", code)
	}
	if !strings.Contains(out.String(), "No service port to proxy") {
		t.Errorf("output:\n%s", out.String())
	}
}

// Past 256 proxy ports the guard holds one rule per block of 16 port
// numbers: explain shows, for each service port, the grouped rule that
// covers its proxy port, as the kernel would hold it.
func TestExplainShowsTheGroupedGuardRule(t *testing.T) {
	dir := t.TempDir()
	var b strings.Builder
	for i := range 300 {
		fmt.Fprintf(&b, "---\napiVersion: v1\nkind: Service\nmetadata:\n  name: s%03d\n  namespace: default\nspec:\n  clusterIP: 10.96.%d.%d\n  ports:\n  - name: http\n    port: 80\n    protocol: TCP\n",
			i, i/250, i%250+1)
	}
	if err := os.WriteFile(filepath.Join(dir, "many.yaml"), []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if code := explain(t.Context(), []string{"--manifests", dir}, &out); code != 0 {
		t.Fatalf("exit %d:\n%s", code, out.String())
	}
	sockets := regexp.MustCompile(`proxy socket: +[0-9.]+:(\d+) `)
	checked := 0
	for _, section := range strings.Split(out.String(), "\n== ")[1:] {
		if !strings.HasPrefix(section, "default/s") {
			continue // the full rule dump at the end
		}
		m := sockets.FindStringSubmatch(section)
		if m == nil {
			t.Fatalf("no proxy socket in:\n%s", section)
		}
		port, _ := strconv.Atoi(m[1])
		var guard string
		for _, line := range strings.Split(section, "\n") {
			if line = strings.TrimSpace(line); strings.HasPrefix(line, "-A "+iptables.ChainProxyPortGuard+" ") {
				guard = strings.TrimPrefix(line, "-A "+iptables.ChainProxyPortGuard+" ")
			}
		}
		_, ports, _, ok := iptables.GuardRulePorts(guard)
		if !ok || !slices.Contains(ports, port) || !strings.Contains(guard, "-m multiport --dports ") {
			t.Fatalf("proxy port %d: guard rule %q, want the multiport rule of its block", port, guard)
		}
		checked++
	}
	if checked != 300 {
		t.Errorf("%d service ports explained, want 300", checked)
	}
}

// A port without endpoints is explained by what its client sees: a TCP
// reset, or for UDP an ICMP port unreachable (a UDP port said "TCP reset").
func TestExplainNoEndpointsByProtocol(t *testing.T) {
	got := explainManifests(t, `apiVersion: v1
kind: Service
metadata: {name: dns, namespace: default}
spec:
  clusterIP: 10.96.0.53
  ports: [{name: dns, port: 53, protocol: UDP}, {name: tcp, port: 53}]
`)
	outputHas(t, got,
		"none: no EndpointSlice names the Service; a UDP client's datagram is answered with ICMP port unreachable until one does",
		"none: no EndpointSlice names the Service; a TCP client's connection is reset until one does",
	)
}

// An externalTrafficPolicy: Local Service is explained with its second
// socket and that socket's endpoints, this node's own, or what an external
// client meets without one (explain showed only the cluster-wide list).
func TestExplainExternalTrafficPolicyLocal(t *testing.T) {
	const manifests = `apiVersion: v1
kind: Service
metadata: {name: web, namespace: default}
spec:
  type: NodePort
  clusterIP: 10.96.0.80
  externalTrafficPolicy: Local
  ports: [{name: http, port: 80, nodePort: 30080}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, namespace: default, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints:
- {addresses: [10.1.0.1], nodeName: node-a}
- {addresses: [10.1.0.2], nodeName: node-b}
`
	for _, tt := range []struct{ node, want string }{
		{"node-a", "local endpoints:  10.1.0.1:8080 (this node's own)"},
		{"node-c", "local endpoints:  none on this node: external clients are refused here"},
	} {
		got := explainManifests(t, manifests, "--hostname-override", tt.node)
		for _, want := range []string{"external socket:  0.0.0.0:", tt.want, "endpoints:        10.1.0.1:8080, 10.1.0.2:8080"} {
			if !strings.Contains(got, want) {
				t.Errorf("%s: output lacks %q:\n%s", tt.node, want, got)
			}
		}
	}
	// A NodePort Service has no healthCheckNodePort (nor has a manifests
	// LoadBalancer that names none): explain promised one. A LoadBalancer's
	// is named.
	got := explainManifests(t, manifests, "--hostname-override", "node-c")
	if want := "the Service has no healthCheckNodePort"; !strings.Contains(got, want) || strings.Contains(got, "healthCheckNodePort tells") {
		t.Errorf("NodePort Service: output lacks %q (or promises a health check):\n%s", want, got)
	}
	lb := strings.Replace(manifests, "  type: NodePort\n", "  type: LoadBalancer\n  healthCheckNodePort: 31080\n", 1)
	got = explainManifests(t, lb, "--hostname-override", "node-c")
	if want := "healthCheckNodePort 31080 tells a load balancer to send them to nodes that have one"; !strings.Contains(got, want) {
		t.Errorf("LoadBalancer Service: output lacks %q:\n%s", want, got)
	}
}

// Each family's portals DNAT to that family's node IP, and explain names
// both (it named one, whose family the other family's rules did not use).
func TestExplainNamesEachFamilysNodeIP(t *testing.T) {
	e := explanation{source: "m", bind: netip.MustParseAddr("0.0.0.0"), kernelPorts: true,
		nodeIPs: []netip.Addr{netip.MustParseAddr("192.168.50.10"), netip.MustParseAddr("fd00:50::10")}}
	var out bytes.Buffer
	if err := e.write(&out); err != nil {
		t.Fatal(err)
	}
	if want := "sent to 192.168.50.10 (IPv4) or fd00:50::10 (IPv6)"; !strings.Contains(out.String(), want) {
		t.Fatalf("output lacks %q:\n%s", want, out.String())
	}
}

// With an API server the node IP's default is the Node object's address
// (the default route's only without one), as the proxy resolves it; the
// header said "by default the address of the interface holding the
// default route" there too, naming the wrong place to look.
func TestExplainSaysWhereTheNodeIPComesFrom(t *testing.T) {
	for _, tt := range []struct {
		api  bool
		want string
	}{
		{false, "(--node-ip; by default the address of the interface holding the default route)"},
		{true, "(--node-ip; by default its Node object's address, else the address of the interface\nholding the default route)"},
	} {
		e := explanation{source: "m", fromAPIServer: tt.api, bind: netip.MustParseAddr("0.0.0.0"), kernelPorts: true,
			nodeIPs: []netip.Addr{netip.MustParseAddr("192.168.50.10")}}
		var out bytes.Buffer
		if err := e.write(&out); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(out.String(), tt.want) {
			t.Errorf("API server %v: output lacks %q:\n%s", tt.api, tt.want, out.String())
		}
	}
}

// A dual-stack port's endpoints are balanced per family, and its IPv6
// rules are ip6tables-restore input: explain says both (it presented one
// list in one order, and "iptables-restore" for IPv6).
func TestExplainDualStack(t *testing.T) {
	const dualStack = `apiVersion: v1
kind: Service
metadata: {name: ds, namespace: default}
spec:
  clusterIPs: [10.96.0.20, "fd36:96::20"]
  ports: [{name: http, port: 80}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: ds-4, namespace: default, labels: {kubernetes.io/service-name: ds}}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints: [{addresses: [10.1.0.1]}]
`
	const sixSlice = `---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: ds-6, namespace: default, labels: {kubernetes.io/service-name: ds}}
addressType: IPv6
ports: [{name: http, port: 8080}]
endpoints: [{addresses: ["fd00:1::1"]}]
`
	got := explainManifests(t, dualStack+sixSlice)
	for _, want := range []string{"each family apart: IPv4 clients take the IPv4 ones, IPv6 clients the IPv6 ones",
		"== All IPv6 rules as ip6tables-restore input"} {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %q:\n%s", want, got)
		}
	}
	// Without its IPv6 slice the Service refuses IPv6 clients.
	if got, want := explainManifests(t, dualStack), "IPv4 clients only: an IPv6 client is refused (no IPv6 endpoint)"; !strings.Contains(got, want) {
		t.Errorf("output lacks %q:\n%s", want, got)
	}
}

// explainManifests runs explain on manifests (one file's YAML) with args
// besides --manifests, and returns its output; a non-zero exit fails t.
func explainManifests(t *testing.T, manifests string, args ...string) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "svc.yaml"), []byte(manifests), 0o644); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if code := explain(t.Context(), append([]string{"--manifests", dir}, args...), &out); code != 0 {
		t.Fatalf("exit %d:\n%s", code, out.String())
	}
	return out.String()
}

// --iptables=false: the proxy serves its sockets and installs no rule, so
// explain shows no rule, and the loopback --bind-address it allows is
// accepted (explain printed DNAT rules to 127.0.0.1 and an
// iptables-restore block).
func TestExplainWithoutIptables(t *testing.T) {
	var out bytes.Buffer
	code := explain(t.Context(), []string{"--manifests", "../../examples/manifests", "--iptables=false", "--bind-address", "127.0.0.1"}, &out)
	if code != 0 {
		t.Fatalf("exit %d", code)
	}
	got := out.String()
	outputHas(t, got,
		"--iptables=false: no rules would be installed",
		"proxy socket:     127.0.0.1:61001 (example port): where clients connect, no rule leads here",
		"rules:            none (--iptables=false)",
	)
	for _, bad := range []string{"-A ", "DNAT", "iptables-restore", "Each rule is shown"} {
		if strings.Contains(got, bad) {
			t.Errorf("output holds %q:\n%s", bad, got)
		}
	}
}

// Invalid objects are left out, as the proxy leaves them out: stdout says
// how many, and the exit status is 1 so that CI catches them (explain
// exited 0 with "No service port to proxy" when every one was invalid,
// and said nothing of those left out beside valid ones).
func TestExplainCountsInvalidObjects(t *testing.T) {
	bad := map[string]string{
		"port.yaml":   "apiVersion: v1\nkind: Service\nmetadata: {name: big, namespace: default}\nspec:\n  clusterIP: 10.96.0.30\n  ports: [{name: http, port: 70000}]\n",
		"kind.yaml":   "apiVersion: v1\nkind: Servce\nmetadata: {name: typo, namespace: default}\nspec:\n  clusterIP: 10.96.0.31\n  ports: [{name: http, port: 80}]\n",
		"syntax.yaml": "apiVersion: v1\nkind: Service\nmetadata: {name: syn\n  spec: [\n",
	}
	for _, tc := range []struct {
		name string
		good bool
		want string
	}{
		{"all invalid", false, "3 manifest objects were invalid and are left out"},
		{"some invalid", true, "3 manifest objects were invalid and are left out"},
	} {
		dir := t.TempDir()
		for name, data := range bad {
			if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		if tc.good {
			data, err := os.ReadFile("../../examples/manifests/web.yaml")
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, "web.yaml"), data, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		var out bytes.Buffer
		if code := explain(t.Context(), []string{"--manifests", dir}, &out); code != 1 {
			t.Errorf("%s: exit %d, want 1", tc.name, code)
		}
		if !strings.Contains(out.String(), tc.want) {
			t.Errorf("%s: output lacks %q:\n%s", tc.name, tc.want, out.String())
		}
		if tc.good && !strings.Contains(out.String(), "== default/web:http (TCP) ==") {
			t.Errorf("%s: the valid Service is not explained:\n%s", tc.name, out.String())
		}
	}
}

// What the proxy warns about (at info level, which explain does not show)
// is in the explanation: an annotation under our prefix it does not know
// (explain said "faults: none" for a misspelt fault annotation) and SCTP
// ports it skips (explain left them out without a word), also of a
// Service that has no other port.
func TestExplainShowsServiceWarnings(t *testing.T) {
	got := explainManifests(t, `apiVersion: v1
kind: Service
metadata:
  name: web
  namespace: default
  annotations: {kube-userspace-proxy/fault: "x"}
spec:
  clusterIP: 10.96.0.40
  ports: [{name: http, port: 80}, {name: sig, port: 5000, protocol: SCTP}]
---
apiVersion: v1
kind: Service
metadata: {name: sig, namespace: default}
spec:
  clusterIP: 10.96.0.41
  ports: [{name: sig, port: 5001, protocol: SCTP}]
`)
	outputHas(t, got,
		"faults:           none\nwarnings:         annotations this proxy does not know are ignored: kube-userspace-proxy/fault (known: kube-userspace-proxy/faults, ",
		"\n                  SCTP ports are skipped (the userspace proxy carries TCP and UDP): sig 5000/SCTP\n",
		"== default/sig (no service port to proxy) ==\nwarnings:         SCTP ports are skipped (the userspace proxy carries TCP and UDP): sig 5001/SCTP\n",
	)
}

// A headless and an ExternalName Service, which kube-proxy does not proxy
// (cluster DNS answers for them), are named with why: explain left them
// out without a word, while the proxy's summary counted them among its
// Services, so a learner could not tell "not proxied, as in kube-proxy"
// from "lost".
func TestExplainNamesTheServicesItDoesNotProxy(t *testing.T) {
	got := explainManifests(t, `apiVersion: v1
kind: Service
metadata: {name: db, namespace: default}
spec:
  clusterIP: None
  ports: [{port: 5432}]
---
apiVersion: v1
kind: Service
metadata: {name: search, namespace: default}
spec:
  type: ExternalName
  externalName: search.example.com
`)
	outputHas(t, got,
		"== default/db (no service port to proxy) ==\nwarnings:         not proxied: a headless Service (clusterIP None) has no service address; cluster DNS answers its name with its endpoints' addresses, which clients reach directly (as kube-proxy, which installs nothing for it)\n",
		"== default/search (no service port to proxy) ==\nwarnings:         not proxied: type ExternalName is a name in cluster DNS only, an alias (CNAME) of search.example.com; no address, rule or proxy socket is involved (as kube-proxy)\n",
	)
}

// explain's help lists the flags that change its output, words
// --manifests as explain reads it (once), and gives the synopsis main's
// help gives; the proxy's other flags are accepted unlisted, so that a
// proxy's command line can be pasted, but --cleanup, an action, is
// refused (explain listed ~40 flags, said --manifests is "re-read on
// change", and ran a normal explain with --cleanup, exit 0).
func TestExplainHelpAndProxyFlags(t *testing.T) {
	var code int
	help := captureStdout(t, func() { code = explain(t.Context(), []string{"--help"}, &bytes.Buffer{}) })
	if code != 0 {
		t.Fatalf("--help: exit %d", code)
	}
	for _, want := range []string{"--manifests", "read once", "--kubeconfig", "--bind-address", "--node-ip", "--proxy-port-range", "--iptables", "--timeout",
		"Usage: kube-userspace-proxy explain (--manifests PATH | --kubeconfig PATH | --master URL) [flags]"} {
		if !strings.Contains(help, want) {
			t.Errorf("explain --help lacks %q:\n%s", want, help)
		}
	}
	_, flags, _ := strings.Cut(help, "\nFlags:\n")
	for _, hidden := range []string{"re-read on change", "--cleanup", "--udp-timeout", "--mptcp", "--fault-api-bind-address", "--healthz-bind-address", "--data-path"} {
		if strings.Contains(flags, hidden) {
			t.Errorf("explain --help lists %q:\n%s", hidden, help)
		}
	}
	mainHelp := captureStdout(t, func() { runMain([]string{"--help"}) })
	if want := "kube-userspace-proxy explain (--manifests PATH | --kubeconfig PATH | --master URL) [flags]\n"; !strings.Contains(mainHelp, want) {
		t.Errorf("main --help lacks %q:\n%s", want, mainHelp)
	}
	var out bytes.Buffer
	if code := explain(t.Context(), []string{"--manifests", "../../examples/manifests", "--udp-timeout", "1s", "--mptcp",
		"--fault-api-bind-address", "127.0.0.1:8474", "--healthz-bind-address", "0.0.0.0:10256"}, &out); code != 0 {
		t.Errorf("the proxy's flags: exit %d, want 0", code)
	}
	stderr := capture(t, &os.Stderr, func() {
		code = explain(t.Context(), []string{"--manifests", "../../examples/manifests", "--cleanup"}, &out)
	})
	if code != exitUsage || !strings.Contains(stderr, "--cleanup is an action") {
		t.Errorf("--cleanup: exit %d, stderr %q; want %d and a refusal", code, stderr, exitUsage)
	}
}

// On a node without a default route and without --node-ip the portals
// REDIRECT: the header says so (the rules turned into REDIRECT and the
// node-IP sentence vanished without a word), and the OUTPUT rule's comment
// says where the node's own traffic goes, loopback.
func TestExplainWithoutDefaultRoute(t *testing.T) {
	saved := defaultRoutes
	none := func() netip.Addr { return netip.Addr{} }
	defaultRoutes.v4, defaultRoutes.v6 = none, none
	defer func() { defaultRoutes = saved }()
	var out bytes.Buffer
	if code := explain(t.Context(), []string{"--manifests", "../../examples/manifests"}, &out); code != 0 {
		t.Fatalf("exit %d", code)
	}
	got := out.String()
	outputHas(t, got,
		"No IPv4 default route and no --node-ip: portals fall back to REDIRECT (README, \"iptables\nrules\")",
		"-A KUBE-PORTALS-HOST -d 10.96.0.10/32 -p tcp -m comment --comment \"default/web:http\" -m tcp --dport 80 -j REDIRECT --to-ports ",
		"sent by this node itself (OUTPUT): redirects it to the proxy socket 127.0.0.1:",
	)
}

// outputHas fails the test for each of wants that got does not contain.
func outputHas(t *testing.T, got string, wants ...string) {
	t.Helper()
	for _, want := range wants {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %q:\n%s", want, got)
		}
	}
}

// A fault reads as what it does and to whom: its attributes and its
// clients (explain showed name, type, stream and toxicity only, so a
// latency of 300 ms for 10.0.0.0/8 read as one of unknown size for
// everyone).
func TestExplainShowsWhatAFaultDoes(t *testing.T) {
	got := explainManifests(t, `apiVersion: v1
kind: Service
metadata:
  name: web
  namespace: default
  annotations:
    kube-userspace-proxy/faults: '[{"name":"slow","type":"latency","attributes":{"latency":300},"clients":["10.0.0.0/8"]}]'
spec:
  clusterIP: 10.96.0.40
  ports: [{name: http, port: 80}]
`)
	outputHas(t, got, "faults:           slow (latency, downstream, toxicity 1, jitter=0 latency=300, clients 10.0.0.0/8)\n")
}

// A toxic's own seed decides which connections it draws (it replaces
// --fault-seed), so explain shows it beside the toxicity; it showed the
// toxicity alone, as if the flag's seed drew.
func TestExplainShowsAToxicsSeed(t *testing.T) {
	got := explainManifests(t, `apiVersion: v1
kind: Service
metadata:
  name: web
  namespace: default
  annotations:
    kube-userspace-proxy/faults: '[{"name":"flaky","type":"reset_peer","toxicity":0.1,"seed":7}]'
spec:
  clusterIP: 10.96.0.40
  ports: [{name: http, port: 80}]
`)
	outputHas(t, got, "faults:           flaky (reset_peer, downstream, toxicity 0.1, seed 7, timeout=0)\n")
}

// An internalTrafficPolicy: Local Service (externalTrafficPolicy left at
// Cluster) keeps cluster IP traffic on this node's endpoints, and has an
// external socket because of that policy, holding every node's endpoints.
// explain took any external socket for externalTrafficPolicy Local: on a
// node without the endpoint it said "none ready" of a ready endpoint, and
// listed another node's endpoint as "this node's own".
func TestExplainInternalTrafficPolicyLocal(t *testing.T) {
	const manifests = `apiVersion: v1
kind: Service
metadata: {name: itp, namespace: t}
spec:
  type: NodePort
  clusterIP: 10.96.1.50
  internalTrafficPolicy: Local
  ports: [{port: 80, targetPort: 8080, nodePort: 30055}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: itp-1, namespace: t, labels: {kubernetes.io/service-name: itp}}
addressType: IPv4
ports: [{port: 8080}]
endpoints: [{addresses: [10.60.0.12], conditions: {ready: true}, nodeName: node2}]
`
	for _, tt := range []struct {
		node  string
		wants []string
	}{
		{"node1", []string{
			"endpoints:        none on this node: internalTrafficPolicy Local sends cluster IP traffic to this\n" +
				"                  node's endpoints only, so a TCP client's connection is reset (other nodes' are\n" +
				"                  not used for it)\n",
		}},
		{"node2", []string{
			"endpoints:        10.60.0.12:8080\n                  this node's own only: internalTrafficPolicy Local\n",
		}},
	} {
		got := explainManifests(t, manifests, "--hostname-override", tt.node, "--node-ip", "192.168.50.10")
		outputHas(t, got, append(tt.wants,
			"external socket:  0.0.0.0:61002 (example port): NodePort, external and LoadBalancer IP traffic\n"+
				"                  from other hosts comes here, to every node's endpoints (externalTrafficPolicy\n"+
				"                  Cluster; only cluster IP traffic stays on this node's, by internalTrafficPolicy\n"+
				"                  Local)\n",
			"all endpoints:    10.60.0.12:8080 (every node's)\n")...)
		for _, bad := range []string{"none ready", "externalTrafficPolicy Local", "(this node's own)", "local endpoints:"} {
			if strings.Contains(got, bad) {
				t.Errorf("%s: output holds %q:\n%s", tt.node, bad, got)
			}
		}
	}
	// Both Local: this node's endpoints for cluster IP traffic and other
	// hosts', every node's for the node's own (and its pods') to the
	// external addresses, as kube-proxy's shortcut.
	both := strings.Replace(manifests, "internalTrafficPolicy: Local", "internalTrafficPolicy: Local\n  externalTrafficPolicy: Local", 1)
	got := explainManifests(t, both, "--hostname-override", "node1", "--node-ip", "192.168.50.10")
	outputHas(t, got,
		"endpoints:        none on this node: internalTrafficPolicy and externalTrafficPolicy Local send\n"+
			"                  cluster IP traffic and other hosts' NodePort, external and LoadBalancer IP\n"+
			"                  traffic to this node's endpoints only",
		"external socket:  0.0.0.0:61002 (example port): this node's own traffic to NodePorts, external and\n"+
			"                  LoadBalancer IPs (and its pods', with --cluster-cidr) comes here, to every\n"+
			"                  node's endpoints, as kube-proxy's (both traffic policies Local: other hosts'\n"+
			"                  stays on this node's, with cluster IP traffic)\n",
		"all endpoints:    10.60.0.12:8080 (every node's)\n",
		"-A KUBE-NODEPORT-HOST -p tcp -m comment --comment \"t/itp\" -m tcp --dport 30055 -j DNAT --to-destination 192.168.50.10:61002\n")
	if strings.Contains(got, "none ready") {
		t.Errorf("both Local:\n%s", got)
	}
}

// The rules block ends each table with the jumps from the built-in chains
// into ours, as comment lines: the block stays restore input that makes
// our chains hold exactly its rules, and the jumps, uncommented, put into
// an empty kernel exactly what a proxy's first sync puts there (explain
// left them out, though README said it printed every rule).
func TestExplainShowsTheJumps(t *testing.T) {
	var out bytes.Buffer
	if code := explain(t.Context(), []string{"--manifests", "../../examples/manifests", "--node-ip", "192.168.50.10"}, &out); code != 0 {
		t.Fatalf("exit %d", code)
	}
	_, block, ok := strings.Cut(out.String(), "== All IPv4 rules as iptables-restore input")
	if !ok {
		t.Fatalf("no IPv4 rules block:\n%s", out.String())
	}
	_, block, _ = strings.Cut(block, "\n")
	block, _, _ = strings.Cut(block, "\n== ")
	var uncommented []string
	jumps := 0
	for _, line := range strings.Split(block, "\n") {
		if rule, ok := strings.CutPrefix(line, "# "); ok && (strings.HasPrefix(rule, "-I ") || strings.HasPrefix(rule, "-A ")) {
			line = rule
			jumps++
		}
		uncommented = append(uncommented, line)
	}
	if jumps == 0 {
		t.Fatalf("no jump in the IPv4 rules block:\n%s", block)
	}

	asIs := iptables.NewFakeRunner(iptables.IPv4)
	if err := asIs.Restore([]byte(block)); err != nil {
		t.Fatalf("the block as printed is not restore input: %v", err)
	}
	withJumps := iptables.NewFakeRunner(iptables.IPv4)
	if err := withJumps.Restore([]byte(strings.Join(uncommented, "\n"))); err != nil {
		t.Fatalf("the block with its jumps uncommented is not restore input: %v", err)
	}
	proxy := iptables.NewFakeRunner(iptables.IPv4)
	if err := iptables.New(proxy, iptables.Config{Family: iptables.IPv4}).Sync(nil); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		table iptables.Table
		chain string
	}{{iptables.TableNAT, "PREROUTING"}, {iptables.TableNAT, "OUTPUT"}, {iptables.TableFilter, "INPUT"}} {
		if got := asIs.Rules(c.table, c.chain); len(got) != 0 {
			t.Errorf("%s %s: the block as printed adds %q", c.table, c.chain, got)
		}
		got, want := withJumps.Rules(c.table, c.chain), proxy.Rules(c.table, c.chain)
		if len(want) == 0 || !slices.Equal(got, want) {
			t.Errorf("%s %s: the block's jumps make\n%q\nthe proxy's first sync\n%q", c.table, c.chain, got, want)
		}
	}
}

// --service-node-port-range sets the range a manifest's nodePort must fall
// in, for explain as for the proxy (the same source options): a NodePort
// of a cluster whose API server uses 20000-22767 was invalid, exit 1,
// whatever the flags said. explain's help lists the flag.
func TestExplainServiceNodePortRange(t *testing.T) {
	const nodePort = `apiVersion: v1
kind: Service
metadata: {name: np, namespace: default}
spec: {type: NodePort, clusterIP: 10.96.7.1, ports: [{name: http, port: 80, nodePort: 20080}]}
`
	got := explainManifests(t, nodePort, "--service-node-port-range", "20000-22767")
	outputHas(t, got, `-A KUBE-NODEPORT-CONTAINER -p tcp -m comment --comment "default/np:http" -m tcp --dport 20080`)

	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "np.yaml"), []byte(nodePort), 0o644); err != nil {
		t.Fatal(err)
	}
	var stderr string
	var code int
	stderr = capture(t, &os.Stderr, func() { code = explain(t.Context(), []string{"--manifests", dir}, &bytes.Buffer{}) })
	if want := "spec.ports[0].nodePort: 20080 is out of the node port range 30000-32767"; code != 1 || !strings.Contains(stderr, want) {
		t.Errorf("default range: exit %d, stderr %q; want 1 and %q", code, stderr, want)
	}
	stderr = capture(t, &os.Stderr, func() {
		code = explain(t.Context(), []string{"--manifests", dir, "--service-node-port-range", "20000-"}, &bytes.Buffer{})
	})
	if code != exitUsage || !strings.Contains(stderr, "--service-node-port-range: invalid port range") {
		t.Errorf("a bad range: exit %d, stderr %q; want %d naming the flag", code, stderr, exitUsage)
	}
	help := captureStdout(t, func() { explain(t.Context(), []string{"--help"}, &bytes.Buffer{}) })
	if !strings.Contains(help, "--service-node-port-range") {
		t.Errorf("explain --help lacks --service-node-port-range:\n%s", help)
	}
}

// A --proxy-port-range over a NodePort: explain numbers the proxy ports
// around it, as the proxy never gives a proxy socket a node port, and
// counts a range of node ports only as holding none (it showed 30080,
// web-nodeport's NodePort, as a proxy port of the range 30078-30082).
func TestExplainProxyPortsSkipNodePorts(t *testing.T) {
	var out bytes.Buffer
	if code := explain(t.Context(), []string{"--manifests", "../../examples/manifests", "--proxy-port-range", "30078-30082"}, &out); code != 0 {
		t.Fatalf("exit %d:\n%s", code, out.String())
	}
	got := out.String()
	if strings.Contains(got, ":30080 (example port)") {
		t.Errorf("NodePort 30080 shown as a proxy port:\n%s", got)
	}
	outputHas(t, got, "0.0.0.0:30078 (example port)", "0.0.0.0:30079 (example port)", "0.0.0.0:30081 (example port)", "0.0.0.0:30082 (example port)")
	out.Reset()
	if code := explain(t.Context(), []string{"--manifests", "../../examples/manifests", "--proxy-port-range", "30080"}, &out); code != 0 {
		t.Fatalf("exit %d:\n%s", code, out.String())
	}
	outputHas(t, out.String(), "proxy socket:     none: proxy port range exhausted: --proxy-port-range holds 0,")
}

// A manifest that is not a regular file (a named pipe) is an error of the
// proxy's (its file keeps its last good objects): explain said nothing of
// it and exited 0.
func TestExplainCountsUnreadableManifest(t *testing.T) {
	dir := t.TempDir()
	data, err := os.ReadFile("../../examples/manifests/web.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "web.yaml"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(filepath.Join(dir, "pipe.yaml"), 0o644); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if code := explain(t.Context(), []string{"--manifests", dir}, &out); code != 1 {
		t.Errorf("exit %d, want 1", code)
	}
	if want := "1 manifest object was invalid"; !strings.Contains(out.String(), want) {
		t.Errorf("output lacks %q:\n%s", want, out.String())
	}
	if !strings.Contains(out.String(), "== default/web:http (TCP) ==") {
		t.Errorf("the valid Service is not explained:\n%s", out.String())
	}
}

// A Service port whose EndpointSlices hold endpoints, but under another
// port name or protocol (the slice's port unnamed beside a named Service
// port, a UDP port's slice without protocol: TCP), or under no port at
// all, gets no endpoint, as in kube-proxy. explain said "none ready",
// which sent the user to the endpoints' conditions; it now says what the
// slices carry and what they must. A slice whose port matches, with no
// ready endpoint, is still "none ready", with no such warning.
func TestExplainSlicePortNameMismatch(t *testing.T) {
	got := explainManifests(t, `apiVersion: v1
kind: Service
metadata: {name: web, namespace: default}
spec:
  clusterIP: 10.96.0.40
  ports: [{name: http, port: 80, targetPort: 8080}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, namespace: default, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{port: 8080}]
endpoints: [{addresses: [10.1.0.1]}]
---
apiVersion: v1
kind: Service
metadata: {name: dns, namespace: default}
spec:
  clusterIP: 10.96.0.53
  ports: [{name: dns, port: 53, protocol: UDP}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: dns-1, namespace: default, labels: {kubernetes.io/service-name: dns}}
addressType: IPv4
ports: [{name: dns, port: 5353}]
endpoints: [{addresses: [10.1.0.2]}]
---
apiVersion: v1
kind: Service
metadata: {name: bare, namespace: default}
spec:
  clusterIP: 10.96.0.54
  ports: [{port: 80}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: bare-1, namespace: default, labels: {kubernetes.io/service-name: bare}}
addressType: IPv4
endpoints: [{addresses: [10.1.0.3]}]
---
apiVersion: v1
kind: Service
metadata: {name: down, namespace: default}
spec:
  clusterIP: 10.96.0.55
  ports: [{name: http, port: 80}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: down-1, namespace: default, labels: {kubernetes.io/service-name: down}}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints: [{addresses: [10.1.0.4], conditions: {ready: false}}]
`, "--node-ip", "192.168.50.10")
	outputHas(t, got,
		"== default/web:http (TCP) ==",
		`warnings:         port "http" (TCP) gets no endpoint: the Service's EndpointSlices have endpoints only for an unnamed TCP port (8080); an EndpointSlice port must have the Service port's name and protocol`,
		`warnings:         port "dns" (UDP) gets no endpoint: the Service's EndpointSlices have endpoints only for port "dns" TCP (5353; a port without protocol is TCP); an EndpointSlice port must have the Service port's name and protocol`,
		`warnings:         the unnamed port (TCP) gets no endpoint: the Service's EndpointSlices have endpoints but list no port; an EndpointSlice port must have the Service port's name and protocol`,
	)
	down := got[strings.Index(got, "== default/down:http (TCP) =="):]
	down = down[:strings.Index(down, "rules:")]
	if !strings.Contains(down, "none ready") || strings.Contains(down, "warnings:") {
		t.Errorf("a matching slice with no ready endpoint must read \"none ready\", with no warning:\n%s", down)
	}
}

// A Service that no EndpointSlice names (a Service with a selector and no
// slice, as one is written for a cluster; a slice whose service-name label
// is misspelt, or in another namespace) has no endpoint, as in kube-proxy,
// which takes endpoints from slices only, never from the selector. explain
// said "none ready", which sent the user to the endpoints' conditions; it
// now says no slice names the Service, what must, which slices of its
// namespace name a Service that does not exist, and which slices of
// another namespace carry its name where no Service has it.
func TestExplainServiceNoSliceNames(t *testing.T) {
	got := explainManifests(t, `apiVersion: v1
kind: Service
metadata: {name: web, namespace: default}
spec:
  clusterIP: 10.96.0.40
  selector: {app: web}
  ports: [{name: http, port: 80, targetPort: 8080}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: webb-1, namespace: default, labels: {kubernetes.io/service-name: webb}}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints: [{addresses: [10.1.0.1]}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, namespace: other, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints: [{addresses: [10.1.0.2]}]
`, "--node-ip", "192.168.50.10")
	web := got[strings.Index(got, "== default/web:http (TCP) =="):]
	web = web[:strings.Index(web, "rules:")]
	outputHas(t, web,
		"endpoints:        none: no EndpointSlice names the Service; a TCP client's connection is reset until one does",
		`warnings:         no EndpointSlice names this Service (label kubernetes.io/service-name: web in namespace default): endpoints come only from EndpointSlices (or v1 Endpoints) labelled so, never from the selector (in a cluster the EndpointSlice controller writes them; with --manifests, write them)`,
		`EndpointSlices in namespace default name no Service that exists: webb-1 (kubernetes.io/service-name: webb)`,
		// The slice labelled for it in another namespace: a manifest
		// without metadata.namespace, the commonest way there, was
		// not named (the search stayed in the Service's namespace).
		`; EndpointSlices labelled kubernetes.io/service-name: web in another namespace, which has no Service of that name: other/web-1 (a slice must be in its Service's namespace; one written without metadata.namespace is in default)`,
	)
	if strings.Contains(web, "none ready") {
		t.Errorf("a Service no slice names must not read \"none ready\":\n%s", web)
	}
}

// A Service that only FQDN EndpointSlices name has no endpoint (kube-proxy
// ignores them, as the proxier does), and explain says so: it said "no
// EndpointSlice names the Service" and that endpoints come only from
// slices labelled so, where one is labelled so.
func TestExplainServiceOnlyFQDNSlicesName(t *testing.T) {
	got := explainManifests(t, `apiVersion: v1
kind: Service
metadata: {name: web, namespace: default}
spec:
  clusterIP: 10.96.0.40
  ports: [{name: http, port: 80, targetPort: 8080}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-fqdn, namespace: default, labels: {kubernetes.io/service-name: web}}
addressType: FQDN
ports: [{name: http, port: 8080}]
endpoints: [{addresses: [db.example.com]}]
`, "--node-ip", "192.168.50.10")
	web := got[strings.Index(got, "== default/web:http (TCP) =="):]
	web = web[:strings.Index(web, "rules:")]
	outputHas(t, web,
		"endpoints:        none: only FQDN EndpointSlices name the Service, which give no endpoint; a TCP\n"+
			"                  client's connection is reset until an IPv4 or IPv6 one does",
		`warnings:         only EndpointSlices of addressType FQDN name this Service (web-fqdn): they give no endpoint, as in kube-proxy, which takes endpoints only from IPv4 and IPv6 EndpointSlices (or v1 Endpoints) labelled kubernetes.io/service-name: web in namespace default`,
	)
	for _, bad := range []string{"no EndpointSlice names", "none ready"} {
		if strings.Contains(web, bad) {
			t.Errorf("a Service an FQDN slice names must not read %q:\n%s", bad, web)
		}
	}
}

// A link-local IPv6 --node-ip: the header says that pods' and other
// hosts' traffic is REDIRECTed (a DNAT to it reaches its own link only),
// as the proxy logs at start, and the rules show it.
func TestExplainLinkLocalNodeIP(t *testing.T) {
	const v6 = `apiVersion: v1
kind: Service
metadata: {name: web6, namespace: default}
spec:
  ipFamilies: [IPv6]
  clusterIP: fd00:96::10
  ports: [{name: http, port: 80}]
`
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "web6.yaml"), []byte(v6), 0o644); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if code := explain(t.Context(), []string{"--manifests", dir, "--node-ip", "fe80::1"}, &out); code != 0 {
		t.Fatalf("exit %d", code)
	}
	outputHas(t, out.String(),
		"The IPv6 node IP fe80::1 is link-local: traffic from pods and other hosts is REDIRECTed",
		"-A KUBE-PORTALS-CONTAINER -d fd00:96::10/128 -p tcp -m comment --comment \"default/web6:http\" -m tcp --dport 80 -j REDIRECT --to-ports ",
		"the node's own to the loopback address",
		"-A KUBE-PORTALS-HOST -d fd00:96::10/128 -p tcp -m comment --comment \"default/web6:http\" -m tcp --dport 80 -j REDIRECT --to-ports ",
	)
	if strings.Contains(out.String(), "sent to fe80::1") {
		t.Errorf("explain says the node's own traffic is sent to the link-local node IP:\n%s", out.String())
	}
}

// A single-stack Service whose EndpointSlices with endpoints are all of
// the other family gets no endpoint, as in kube-proxy (its proxier of the
// Service's family holds none of them): explain said "none ready", which
// sent the user to the endpoints' conditions; it now says the slices are
// of the other family. A dual-stack Service with one family's slices only
// is not warned about (its other family's clients are refused, by design).
func TestExplainSliceOfTheOtherFamily(t *testing.T) {
	got := explainManifests(t, `apiVersion: v1
kind: Service
metadata: {name: v4, namespace: default}
spec:
  clusterIP: 10.96.0.41
  ports: [{name: http, port: 80, targetPort: 8080}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: v4-1, namespace: default, labels: {kubernetes.io/service-name: v4}}
addressType: IPv6
ports: [{name: http, port: 8080}]
endpoints: [{addresses: ["fd00:1::1"]}]
---
apiVersion: v1
kind: Service
metadata: {name: dual, namespace: default}
spec:
  clusterIP: 10.96.0.42
  clusterIPs: [10.96.0.42, "fd00:96::42"]
  ipFamilyPolicy: RequireDualStack
  ipFamilies: [IPv4, IPv6]
  ports: [{name: http, port: 80, targetPort: 8080}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: dual-1, namespace: default, labels: {kubernetes.io/service-name: dual}}
addressType: IPv6
ports: [{name: http, port: 8080}]
endpoints: [{addresses: ["fd00:1::2"]}]
`, "--node-ip", "192.168.50.10", "--service-cluster-ip-range", "10.96.0.0/12,fd00:96::/108")
	outputHas(t, got,
		"== default/v4:http (TCP) ==",
		`warnings:         no endpoint: the Service's EndpointSlices with endpoints are IPv6, and an IPv4-only Service takes only IPv4 ones (as kube-proxy)`,
	)
	dual := got[strings.Index(got, "== default/dual:http (TCP) =="):]
	dual = dual[:strings.Index(dual, "rules:")]
	if strings.Contains(dual, "warnings:") {
		t.Errorf("a dual-stack Service with one family's slices is not warned about:\n%s", dual)
	}
}
