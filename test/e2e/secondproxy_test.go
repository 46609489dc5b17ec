package e2e

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/test/harness"
)

// TestSecondProxyWaitsForTheFirst: a second proxy started in the network
// namespace of a running one (a second DaemonSet, an operator's test run,
// a stale systemd unit) with other Services rewrote the first's portals
// at once and removed its Services' rules, and the two repaired each
// other's at their full syncs: the first's Services were refused by
// turns (4,675 of 6,857 connections in 71 s, by hand). It now says so and
// writes no rule, opens no proxy socket, until the first exits; then it
// serves, as a restart over the first's rules.
func TestSecondProxyWaitsForTheFirst(t *testing.T) {
	c, first, e, web := servedWeb(t)
	other := svc{name: "other", clusterIP: "10.96.0.20", endpoints: ips(c, 0, 1)}
	second := newProxy(t, c)
	// Its own HTTP ports: the first's held would not stop it either
	// (retried in the background, as kube-proxy's without
	// --bind-address-hard-fail).
	// A sync period of 1 s puts its health timeout at 2 s, inside the
	// 3 s watched below.
	second.Args = append(second.Args, "--healthz-bind-address", "127.0.0.1:10356", "--metrics-bind-address", "127.0.0.1:10349",
		"--iptables-sync-period", "1s")
	writeSvc(t, second.dir, other)
	before := rulesOf(save(t, c.Node))

	proc := c.Node.Start("second proxy", proxyBin, second.Args...)
	defer proc.Kill()
	wantPID := fmt.Sprintf("pid=%d", first.Proc.Pid)
	for deadline := time.Now().Add(startWithin); ; time.Sleep(20 * time.Millisecond) {
		out := proc.Output()
		if strings.Contains(out, "Another kube-userspace-proxy is running") && strings.Contains(out, wantPID) {
			break
		}
		if time.Now().After(deadline) || proc.Exited() {
			t.Fatalf("the second proxy did not say that the first (pid %d) runs:\n%s", first.Proc.Pid, out)
		}
	}
	// Its manifests are read and its first sync would be in within a
	// second (it rewrote the rules ~0.1 s after its start): watched for
	// three, the rules must stay the first's and its Service served.
	for until := time.Now().Add(3 * time.Second); time.Now().Before(until); time.Sleep(100 * time.Millisecond) {
		if now := rulesOf(save(t, c.Node)); !slices.Equal(now, before) {
			t.Fatalf("a second proxy changed the running one's rules; before:\n%s\nafter:\n%s\nsecond proxy:\n%s",
				strings.Join(before, "\n"), strings.Join(now, "\n"), proc.Output())
		}
		if _, err := e.pod1(0).Ask("tcp", web.tcp(), harness.AnswerTimeout); err != nil {
			t.Fatalf("the running proxy's Service %s beside a second proxy: %v", web.tcp(), err)
		}
	}
	if proc.Exited() {
		t.Fatalf("the second proxy exited while the first ran:\n%s", proc.Output())
	}
	// Waiting is what it should do: its changes are not its to sync yet,
	// so they do not age into a failed /livez (a liveness probe on its own
	// port restarted it, over and over), while /healthz says it serves
	// nothing.
	if code := httpStatus(t, c.Node.HTTPClient(time.Second), "http://127.0.0.1:10356/livez"); code != 200 {
		t.Errorf("the waiting second proxy's /livez answered %d after its health timeout, want 200", code)
	}
	if code := httpStatus(t, c.Node.HTTPClient(time.Second), "http://127.0.0.1:10356/healthz"); code != 503 {
		t.Errorf("the waiting second proxy's /healthz answered %d, want 503 (it serves nothing)", code)
	}

	// The first stops: the second serves its own Services, the first's
	// rules go.
	first.Proc.Signal(syscall.SIGTERM)
	if err := first.Proc.Wait(10 * time.Second); err != nil && !strings.Contains(err.Error(), "signal") {
		t.Logf("first proxy after SIGTERM: %v", err)
	}
	took := e.pod1(0).WaitServed(t, "tcp", other.tcp(), time.Now(), startBudget)
	e.pod1(0).WaitUnserved(t, "tcp", web.tcp(), time.Now(), startBudget)
	figure(t, "second proxy beside a running one: rules unchanged for 3 s; serving its own Service %d ms after the first's exit", took.Milliseconds())
}

// httpStatus is the status code of a GET of url (0 when it fails).
func httpStatus(t *testing.T, client *http.Client, url string) int {
	t.Helper()
	resp, err := client.Get(url)
	if err != nil {
		t.Logf("GET %s: %v", url, err)
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}
