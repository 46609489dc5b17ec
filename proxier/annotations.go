package proxier

import (
	"slices"
	"sort"
	"strings"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/faults"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/internal/clip"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/proxier/config"
)

// annotationPrefix is the prefix of every annotation this proxy reads.
const annotationPrefix = "kube-userspace-proxy/"

// knownAnnotations are the annotations this proxy reads.
var knownAnnotations = []string{
	faults.Annotation, config.MaxConnectionAgeAnnotation, config.DrainRemovedAnnotation,
}

// unknownAnnotations lists svc's annotations under our prefix that this
// proxy does not read and that old did not already carry with the same
// value: a misspelt key ("kube-userspace-proxy/fault") would otherwise be
// ignored without a word, and a fault experiment silently not run.
func unknownAnnotations(old, svc *v1.Service) []string {
	var out []string
	for k, v := range svc.Annotations {
		if !strings.HasPrefix(k, annotationPrefix) || slices.Contains(knownAnnotations, k) {
			continue
		}
		if old != nil {
			if ov, ok := old.Annotations[k]; ok && ov == v {
				continue
			}
		}
		// Named by a bounded prefix (clip): manifests do not hold keys to
		// the API server's 317 bytes.
		out = append(out, clip.String(k))
	}
	sort.Strings(out)
	return out
}

// logUnknownAnnotations says so, once per Service change that brings them.
func logUnknownAnnotations(old, svc *v1.Service) {
	if unknown := unknownAnnotations(old, svc); len(unknown) > 0 {
		klog.InfoS("Warning: annotations this proxy does not know are ignored", "service", klog.KObj(svc),
			"annotations", unknown, "known", knownAnnotations)
	}
}
