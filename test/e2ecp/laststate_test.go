package e2ecp

import (
	"context"
	"strings"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// restartServedBudget bounds how soon a proxy restarted while kube-apiserver is down
// serves from --state-file: its grace (2 s) and a first sync.
const restartServedBudget = 5 * time.Second

// checkRestartDuringOutage restarts the proxy while kube-apiserver is down. Without a
// state file the new process had nothing to serve from until the API server answered:
// every Service on the node failed for the rest of the outage (kube-proxy's kernel rules
// would have kept serving). With --state-file it serves what it last saw within the
// grace (a Service deleted while the proxy was down too: the file's view); once
// kube-apiserver is back, that Service is gone and an endpoint change is followed.
func checkRestartDuringOutage(t *testing.T, e *env) {
	ns := e.cp.Namespace(t)
	pod := e.pod(ipRestartOutage)
	kept, keptSlice := createService(t, e.admin, newService(ns, "kept", 80, 53), readyEndpoints(e.backendIPs(0)...))
	doomed, _ := createService(t, e.admin, newService(ns, "doomed-later", 80, 53), readyEndpoints(e.backendIPs(1)...))
	tcp, udp := servicePort(t, kept, tcpPortName), servicePort(t, kept, udpPortName)
	doomedTCP := servicePort(t, doomed, tcpPortName)
	pod.WaitServed(t, "tcp", tcp, time.Now(), changePatience)
	pod.WaitServed(t, "udp", udp, time.Now(), changePatience)
	pod.WaitServed(t, "tcp", doomedTCP, time.Now(), changePatience)

	// The stop writes the state file: what the proxy saw last. The Service
	// deleted while the proxy is down is in it, and must go once the API
	// server answers the restarted proxy.
	e.proxy.Proc.Signal(syscall.SIGTERM)
	if err := e.proxy.Proc.Wait(20 * time.Second); err != nil {
		t.Logf("proxy exit: %v", err)
	}
	if err := e.admin.CoreV1().Services(ns).Delete(context.Background(), doomed.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.cp.StopAPIServer()
	apiUp := false
	defer func() {
		if !apiUp { // the later checks need it
			e.launch.Run(func() { _ = e.cp.StartAPIServer() })
		}
	}()
	started := time.Now()
	e.proxy.Start(t, 20*time.Second) // /healthz 200: a first sync, from the file (a new process: its own log)
	tcpIn := pod.WaitServed(t, "tcp", tcp, started, restartServedBudget)
	udpIn := pod.WaitServed(t, "udp", udp, started, restartServedBudget)
	pod.WaitServed(t, "tcp", doomedTCP, started, restartServedBudget) // the file's view: deleted since
	t.Logf("FIGURE restart during outage: the restarted proxy served an existing Service %d ms (TCP) and %d ms (UDP) after its start, from --state-file",
		tcpIn.Milliseconds(), udpIn.Milliseconds())
	if len(e.proxy.LogLines("serving the last known state")) == 0 {
		t.Errorf("no log line says the last known state is served")
	}
	if v := e.proxy.Metric(t, "kubeproxy_userspace_last_known_state_serving"); v != 1 {
		t.Errorf("kubeproxy_userspace_last_known_state_serving = %v while serving the file, want 1", v)
	}
	// The node IPs the file kept of the Node (it could not be read): the
	// restarted proxy DNATed to the default route's address (10.77.1.1).
	var host []string
	for _, r := range e.proxy.Rules(t, portName(kept, tcpPortName)) {
		if strings.Contains(r, "KUBE-PORTALS-HOST") {
			host = append(host, r)
		}
	}
	if len(host) == 0 || !allContain("--to-destination "+nodeObjectIP.String()+":")(host) {
		t.Errorf("restarted during the outage, the node's own portals do not DNAT to the Node's InternalIP %s:\n%s", nodeObjectIP, strings.Join(host, "\n"))
	}

	var err error
	e.launch.Run(func() { err = e.cp.StartAPIServer() })
	if err != nil {
		t.Fatalf("restart kube-apiserver: %v", err)
	}
	apiUp = true
	// The file's view must give way to the API server's: the Service
	// deleted meanwhile goes at the sync, and a change made now is followed.
	changed := time.Now()
	setEndpoints(keptSlice, readyEndpoints(e.backendIPs(2)...))
	if _, err := e.admin.DiscoveryV1().EndpointSlices(ns).Update(context.Background(), keptSlice, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("update %s: %v", keptSlice.Name, err)
	}
	s3 := e.backends[2].Name
	moved := pod.WaitFor(t, "tcp", tcp, changed, resyncBudget, "answered by "+s3,
		func(name string, err error) bool { return err == nil && name == s3 })
	gone := pod.WaitUnserved(t, "tcp", doomedTCP, changed, resyncBudget)
	t.Logf("FIGURE restart during outage: once kube-apiserver was back, an endpoint change was followed in %d ms, and the Service deleted while the proxy was down (served from the file) was unserved %d ms after the change",
		moved.Milliseconds(), gone.Milliseconds())
	if len(e.proxy.LogLines("servicesGone=1")) == 0 {
		t.Errorf("the API server's sync did not delete the file's Service deleted meanwhile (no servicesGone=1 line)")
	}
	if len(e.proxy.LogLines("its state replaced the last known state")) == 0 {
		t.Errorf("no log line says the API server's state replaced the last known state")
	}
	if v := e.proxy.Metric(t, "kubeproxy_userspace_last_known_state_serving"); v != 0 {
		t.Errorf("kubeproxy_userspace_last_known_state_serving = %v after the API server's sync, want 0", v)
	}
	// Written at the API server's sync, so after this process started.
	if v := e.proxy.Metric(t, "kubeproxy_userspace_last_known_state_written_timestamp_seconds"); v < float64(started.Unix()) {
		t.Errorf("kubeproxy_userspace_last_known_state_written_timestamp_seconds = %v, before this process started (%d)", v, started.Unix())
	}
}
