package controlplane

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Namespace creates a fresh namespace for one test and returns its name. No
// controller-manager runs, so a deleted namespace would stay Terminating for ever: the
// namespace is left in place and goes away with the control plane.
func (cp *ControlPlane) Namespace(tb testing.TB) string {
	tb.Helper()
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	name := "kup-test-" + hex.EncodeToString(b)
	ns := &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if _, err := cp.AdminClient(tb).CoreV1().Namespaces().Create(context.Background(), ns, metav1.CreateOptions{}); err != nil {
		tb.Fatalf("create namespace %s: %v", name, err)
	}
	return name
}
