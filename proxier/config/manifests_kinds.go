package config

import (
	"fmt"
	"strings"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/internal/suggest"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/internal/clip"
)

// readKinds names the kinds the proxy reads, for messages.
var readKinds = []string{KindService, KindEndpointSlice, KindEndpoints}

// unreadKind says whether a document of a kind the proxy does not read is an
// error, and which. A directory of manifests may hold other objects beside
// the proxy's (a Deployment, a ConfigMap): those are skipped. But a document
// meant as one of the proxy's kinds and misspelt would vanish without a
// word, its Service never served, so these are invalid input:
//   - a kind that differs from a read kind in case only ("service") or by a
//     one-letter typo: one added, dropped, changed, or two swapped ("Servce",
//     "Servcie", "Endpoint", "EndpointSlices"; two would take "Device" for
//     a Service);
//   - any other kind of discovery.k8s.io, whose only kind is EndpointSlice;
//   - a document without apiVersion (outside a typed list, whose items may
//     omit it): it is no Kubernetes object at all.
func unreadKind(apiVersion, kind string, inList bool) error {
	for _, k := range readKinds {
		switch {
		case strings.EqualFold(kind, k):
			return fmt.Errorf("kind %s: kinds are case-sensitive: did you mean %q?", clip.Quote(kind), k)
		case suggest.Distance(strings.ToLower(kind), strings.ToLower(k)) <= 1:
			return fmt.Errorf("kind %s is not one the proxy reads: did you mean %q?", clip.Quote(kind), k)
		}
	}
	group, _, _ := strings.Cut(apiVersion, "/")
	if strings.Contains(apiVersion, "/") && group == "discovery.k8s.io" {
		return fmt.Errorf("kind %s is not in %s: did you mean %q?", clip.Quote(kind), clip.String(apiVersion), KindEndpointSlice)
	}
	if apiVersion == "" && !inList {
		return fmt.Errorf("kind %s has no apiVersion", clip.Quote(kind))
	}
	return nil
}
