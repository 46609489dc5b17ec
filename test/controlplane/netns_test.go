package controlplane_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"os/exec"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/test/controlplane"
)

// TestControlPlaneInNetNS runs the control plane on the loopback of a namespace the test
// creates, the way the e2e suite runs it inside its node namespace, and reaches it from
// the test process, which stays in its own namespace.
func TestControlPlaneInNetNS(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("network namespaces need root")
	}
	controlplane.FindBinaries(t) // skip before creating anything when not built
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	ns := "kup-cp-" + hex.EncodeToString(b)
	if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v: %s", err, out)
	}
	// Registered first, so it runs after the control plane's own cleanup.
	t.Cleanup(func() {
		if out, err := exec.Command("ip", "netns", "delete", ns).CombinedOutput(); err != nil {
			t.Errorf("ip netns delete %s: %v: %s", ns, err, out)
		}
	})
	if out, err := exec.Command("ip", "-n", ns, "link", "set", "lo", "up").CombinedOutput(); err != nil {
		t.Fatalf("lo up: %v: %s", err, out)
	}

	cp := controlplane.Start(t, controlplane.Options{NetNS: ns})
	nss, err := cp.AdminClient(t).CoreV1().Namespaces().List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(nss.Items) == 0 {
		t.Error("no namespaces listed")
	}
}
