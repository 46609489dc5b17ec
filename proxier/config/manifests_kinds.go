package config

import (
	"fmt"
	"strings"
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
			return fmt.Errorf("kind %q: kinds are case-sensitive: did you mean %q?", kind, k)
		case editDistance(strings.ToLower(kind), strings.ToLower(k)) <= 1:
			return fmt.Errorf("kind %q is not one the proxy reads: did you mean %q?", kind, k)
		}
	}
	group, _, _ := strings.Cut(apiVersion, "/")
	if strings.Contains(apiVersion, "/") && group == "discovery.k8s.io" {
		return fmt.Errorf("kind %q is not in %s: did you mean %q?", kind, apiVersion, KindEndpointSlice)
	}
	if apiVersion == "" && !inList {
		return fmt.Errorf("kind %q has no apiVersion", kind)
	}
	return nil
}

// editDistance is the optimal string alignment distance between a and b:
// insertions, deletions, substitutions and swaps of two neighbours.
func editDistance(a, b string) int {
	ra, rb := []rune(a), []rune(b)
	prev2 := make([]int, len(rb)+1)
	prev := make([]int, len(rb)+1)
	cur := make([]int, len(rb)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(ra); i++ {
		cur[0] = i
		for j := 1; j <= len(rb); j++ {
			cost := 1
			if ra[i-1] == rb[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
			if i > 1 && j > 1 && ra[i-1] == rb[j-2] && ra[i-2] == rb[j-1] {
				cur[j] = min(cur[j], prev2[j-2]+1)
			}
		}
		prev2, prev, cur = prev, cur, prev2
	}
	return prev[len(rb)]
}
