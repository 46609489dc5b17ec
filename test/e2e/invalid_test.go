package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/test/harness"
)

// checkInvalidManifestKeepsLastGood: a manifest file turned invalid (a
// Service with a malformed clusterIP) must be reported naming the file and
// the object, while the Service's last good state keeps serving; the next
// valid version takes effect as usual.
func checkInvalidManifestKeepsLastGood(t *testing.T, e *env) {
	s := e.svcs["keep"]
	cl := e.pod1(ipKeep)
	if name, err := cl.Ask("tcp", s.tcp(), harness.AnswerTimeout); err != nil || name != "b1" {
		t.Fatalf("keep before the change: %q, %v; want b1", name, err)
	}
	writeSvc(t, e.p.dir, s)
	file := manifestFile(e.p.dir, s.name)
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	bad := strings.Replace(string(data), "clusterIP: "+s.clusterIP, "clusterIP: 10.96.0.999", 1)
	tmp := filepath.Join(filepath.Dir(e.p.dir), ".keep.bad")
	if err := os.WriteFile(tmp, []byte(bad), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, file); err != nil {
		t.Fatal(err)
	}
	// Longer than a reload and a rate-limited sync: had the bad version been
	// applied, the Service would be gone by now.
	deadline := time.Now().Add(1500 * time.Millisecond)
	for time.Now().Before(deadline) {
		if name, err := cl.Ask("tcp", s.tcp(), harness.AnswerTimeout); err != nil || name != "b1" {
			t.Fatalf("after an invalid edit the last good state must keep serving; got %q, %v", name, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	var reported string
	for _, line := range strings.Split(e.p.Proc.Output(), "\n") {
		if strings.Contains(line, s.name+".yaml") && strings.Contains(line, "10.96.0.999") {
			reported = line
			break
		}
	}
	if reported == "" {
		t.Errorf("no log line names the file %s.yaml and the bad value 10.96.0.999", s.name)
	}

	s.endpoints = ips(e.c, 1) // b2
	writeSvc(t, e.p.dir, s)
	took := untilAnswer(t, cl, s, "b2", time.Now(), 5*time.Second)
	figure(t, "invalid manifest: last good state kept serving 1.5 s; error logged: %s; fixed version live in %d ms",
		strings.TrimSpace(reported), took.Milliseconds())
}
