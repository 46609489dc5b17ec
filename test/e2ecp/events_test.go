package e2ecp

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// checkStartingEvent: the proxy records kube-proxy's Starting event on its Node (reason
// Starting, action StartKubeProxy), through events.k8s.io with examples/deploy's rights
// (checkNoForbidden sees any refusal). It recorded no event at all, while the ClusterRole
// granted event rights for it.
func checkStartingEvent(t *testing.T, e *env) {
	deadline := time.Now().Add(10 * time.Second)
	for {
		list, err := e.admin.EventsV1().Events(metav1.NamespaceDefault).List(context.Background(), metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var seen []string
		for _, ev := range list.Items {
			seen = append(seen, fmt.Sprintf("%s %s/%s %s %s by %s", ev.Type, ev.Regarding.Kind, ev.Regarding.Name, ev.Reason, ev.Action, ev.ReportingController))
			if ev.Regarding.Kind == "Node" && ev.Regarding.Name == nodeName && ev.Reason == "Starting" &&
				ev.Action == "StartKubeProxy" && ev.Type == "Normal" && ev.ReportingController == "kube-userspace-proxy" {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no Starting event on Node %s; events in %s:\n%s", nodeName, metav1.NamespaceDefault, strings.Join(seen, "\n"))
		}
		time.Sleep(200 * time.Millisecond)
	}
}
