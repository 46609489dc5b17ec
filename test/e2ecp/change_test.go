package e2ecp

import (
	"context"
	"net/netip"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/test/harness"
)

// changePatience bounds how long a Service change may take to reach traffic and rules;
// the measured figure is logged, so a slow one shows even when it passes.
const changePatience = 5 * time.Second

// updateService reads the Service, applies change and writes it back, retrying on a
// conflict, and returns what was stored.
func updateService(t *testing.T, c kubernetes.Interface, namespace, name string, change func(*v1.Service)) *v1.Service {
	t.Helper()
	var stored *v1.Service
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		svc, err := c.CoreV1().Services(namespace).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		change(svc)
		stored, err = c.CoreV1().Services(namespace).Update(context.Background(), svc, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatalf("update Service %s/%s: %v", namespace, name, err)
	}
	return stored
}

// portName is how the portal rules name a Service port in their comment.
func portName(svc *v1.Service, port string) string {
	return svc.Namespace + "/" + svc.Name + ":" + port
}

// waitRules polls the node's rules for a Service port until ok accepts them, and returns
// how long that took from since.
func waitRules(t *testing.T, e *env, comment string, since time.Time, what string, ok func([]string) bool) time.Duration {
	t.Helper()
	for {
		rules := e.proxy.Rules(t, comment)
		if ok(rules) {
			return time.Since(since)
		}
		if time.Since(since) > changePatience {
			t.Fatalf("rules of %s not %s within %v; now:\n%s", comment, what, changePatience, strings.Join(rules, "\n"))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// allContain reports whether rules is not empty and every rule contains want.
func allContain(want string) func([]string) bool {
	return func(rules []string) bool {
		for _, r := range rules {
			if !strings.Contains(r, want) {
				return false
			}
		}
		return len(rules) > 0
	}
}

func noRules(rules []string) bool { return len(rules) == 0 }

// checkPortChange moves a Service's TCP port from 80 to 8081: the new port is served and
// the old one is not, and the rules name only the new port.
func checkPortChange(t *testing.T, e *env) {
	ns := e.cp.Namespace(t)
	pod := e.pod(ipPort)
	svc, _ := createService(t, e.admin, newService(ns, "port", 80, 53), readyEndpoints(e.backendIPs(0, 1)...))
	old := servicePort(t, svc, tcpPortName)
	pod.WaitServed(t, "tcp", old, time.Now(), changePatience)

	changed := time.Now()
	svc = updateService(t, e.admin, ns, svc.Name, func(s *v1.Service) { s.Spec.Ports[0].Port = 8081 })
	moved := servicePort(t, svc, tcpPortName)
	served := pod.WaitServed(t, "tcp", moved, changed, changePatience)
	gone := pod.WaitUnserved(t, "tcp", old, changed, changePatience)
	rules := waitRules(t, e, portName(svc, tcpPortName), changed, "on --dport 8081 only", allContain("--dport 8081 "))
	t.Logf("FIGURE port change %s → %s: new port served after %d ms, old port unserved after %d ms, rules updated after %d ms",
		old, moved, served.Milliseconds(), gone.Milliseconds(), rules.Milliseconds())
	pod.MustAsk(t, "udp", servicePort(t, svc, udpPortName)) // the untouched port still serves
}

// checkAffinityTimeoutChange: a ClientIP Service keeps its client on one backend across a
// 2.5 s pause with the default timeout (10800 s); after only timeoutSeconds changes to 2,
// the same pause ends the affinity (kubernetes#107398: the legacy proxier ignored it).
func checkAffinityTimeoutChange(t *testing.T, e *env) {
	const pause = 2500 * time.Millisecond
	ns := e.cp.Namespace(t)
	pod := e.pod(ipAffinity)
	s := newService(ns, "affinity", 80, 53)
	s.Spec.SessionAffinity = v1.ServiceAffinityClientIP
	s.Spec.SessionAffinityConfig = &v1.SessionAffinityConfig{ClientIP: &v1.ClientIPConfig{TimeoutSeconds: ptr.To[int32](10800)}}
	svc, _ := createService(t, e.admin, s, readyEndpoints(e.backendIPs(0, 1, 2)...))
	dst := servicePort(t, svc, tcpPortName)
	pod.WaitServed(t, "tcp", dst, time.Now(), changePatience)

	pinned := pod.MustAsk(t, "tcp", dst)
	for range 3 {
		if got := pod.MustAsk(t, "tcp", dst); got != pinned {
			t.Fatalf("affinity: answered by %s after %s", got, pinned)
		}
	}
	time.Sleep(pause)
	if got := pod.MustAsk(t, "tcp", dst); got != pinned {
		t.Fatalf("timeout 10800 s: after a %v pause answered by %s, want %s still", pause, got, pinned)
	}

	updateService(t, e.admin, ns, svc.Name, func(s *v1.Service) {
		s.Spec.SessionAffinityConfig.ClientIP.TimeoutSeconds = ptr.To[int32](2)
	})
	time.Sleep(2 * time.Second) // two --iptables-min-sync-period: the change is applied
	var trials []string
	moved := false
	for range 2 {
		before := pod.MustAsk(t, "tcp", dst)
		if again := pod.MustAsk(t, "tcp", dst); again != before {
			t.Fatalf("timeout 2 s: answered by %s right after %s: affinity lost altogether", again, before)
		}
		time.Sleep(pause)
		after := pod.MustAsk(t, "tcp", dst)
		trials = append(trials, before+"→"+after)
		moved = moved || after != before
	}
	t.Logf("FIGURE affinity timeoutSeconds 10800→2: before the change %s kept across %v; after it, %v pauses gave %v",
		pinned, pause, pause, trials)
	if !moved {
		t.Errorf("after timeoutSeconds changed to 2, a %v pause never ended the affinity: %v", pause, trials)
	}
}

// checkExternalIPsChange adds an externalIP to a Service: the external host is served
// through it; removing it again removes the portal.
func checkExternalIPsChange(t *testing.T, e *env) {
	const extIP = "10.77.50.20"
	ns := e.cp.Namespace(t)
	ext := harness.Client{NS: e.lab.External}
	svc, _ := createService(t, e.admin, newService(ns, "external", 80, 53), readyEndpoints(e.backendIPs(0, 1)...))
	e.pod(ipExternalIPs).WaitServed(t, "tcp", servicePort(t, svc, tcpPortName), time.Now(), changePatience)
	dst := netip.AddrPortFrom(netip.MustParseAddr(extIP), 80)
	comment := portName(svc, tcpPortName)

	added := time.Now()
	updateService(t, e.admin, ns, svc.Name, func(s *v1.Service) { s.Spec.ExternalIPs = []string{extIP} })
	served := ext.WaitServed(t, "tcp", dst, added, changePatience)
	ext.WaitServed(t, "udp", netip.AddrPortFrom(dst.Addr(), 53), added, changePatience)
	waitRules(t, e, comment, added, "with the externalIP", func(r []string) bool {
		return strings.Contains(strings.Join(r, "\n"), "-d "+extIP+"/32")
	})

	removed := time.Now()
	updateService(t, e.admin, ns, svc.Name, func(s *v1.Service) { s.Spec.ExternalIPs = nil })
	rules := waitRules(t, e, comment, removed, "without the externalIP", func(r []string) bool {
		return len(r) > 0 && !strings.Contains(strings.Join(r, "\n"), extIP)
	})
	gone := ext.WaitUnserved(t, "tcp", dst, removed, changePatience)
	t.Logf("FIGURE externalIPs: %s served to the external host %d ms after it was added; portal gone %d ms and unserved %d ms after it was removed",
		extIP, served.Milliseconds(), rules.Milliseconds(), gone.Milliseconds())
}

// checkServiceDeleted deletes a served Service (its EndpointSlice stays, orphaned, as it
// would until the garbage collector runs): every rule of its ports goes, and so does the
// service.
func checkServiceDeleted(t *testing.T, e *env) {
	ns := e.cp.Namespace(t)
	pod := e.pod(ipDelete)
	svc, _ := createService(t, e.admin, newService(ns, "doomed", 80, 53), readyEndpoints(e.backendIPs(0)...))
	dst := servicePort(t, svc, tcpPortName)
	pod.WaitServed(t, "tcp", dst, time.Now(), changePatience)
	for _, port := range []string{tcpPortName, udpPortName} {
		if len(e.proxy.Rules(t, portName(svc, port))) == 0 {
			t.Fatalf("no rule names %s while it is served", portName(svc, port))
		}
	}

	deleted := time.Now()
	if err := e.admin.CoreV1().Services(ns).Delete(context.Background(), svc.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	tcpRules := waitRules(t, e, portName(svc, tcpPortName), deleted, "removed", noRules)
	waitRules(t, e, portName(svc, udpPortName), deleted, "removed", noRules)
	gone := pod.WaitUnserved(t, "tcp", dst, deleted, changePatience)
	t.Logf("FIGURE delete %s/%s: rules removed after %d ms, unserved after %d ms", ns, svc.Name, tcpRules.Milliseconds(), gone.Milliseconds())
}
