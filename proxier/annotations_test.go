package proxier

import (
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
)

func TestUnknownAnnotations(t *testing.T) {
	withAnnotations := func(kv ...string) *v1.Service {
		svc := makeService("web")
		svc.Annotations = map[string]string{}
		for i := 0; i+1 < len(kv); i += 2 {
			svc.Annotations[kv[i]] = kv[i+1]
		}
		return svc
	}
	for _, tc := range []struct {
		name     string
		old, svc *v1.Service
		want     []string
	}{
		{"none", nil, makeService("web"), nil},
		{"known ones", nil, withAnnotations("kube-userspace-proxy/faults", "[]", "kube-userspace-proxy/max-connection-age", "1h", "kube-userspace-proxy/drain-removed", "true"), nil},
		{"other prefixes", nil, withAnnotations("example.com/faults", "x", "kube-userspace-proxy", "x"), nil},
		{"misspelt", nil, withAnnotations("kube-userspace-proxy/fault", "[]", "kube-userspace-proxy/max-conection-age", "1h"),
			[]string{"kube-userspace-proxy/fault", "kube-userspace-proxy/max-conection-age"}},
		{"already there, same value", withAnnotations("kube-userspace-proxy/fault", "[]"), withAnnotations("kube-userspace-proxy/fault", "[]"), nil},
		{"already there, new value", withAnnotations("kube-userspace-proxy/fault", "[]"), withAnnotations("kube-userspace-proxy/fault", "[1]"),
			[]string{"kube-userspace-proxy/fault"}},
		// Manifests do not check annotation keys (the API server holds them to
		// 317 bytes): a 300 KB key was a 300 KB log line at each change.
		{"a key of 300 KB, named by its first 200 bytes", nil, withAnnotations("kube-userspace-proxy/"+strings.Repeat("x", 300000), "1"),
			[]string{"kube-userspace-proxy/" + strings.Repeat("x", 200-len("kube-userspace-proxy/")) + "... (300021 bytes)"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := unknownAnnotations(tc.old, tc.svc); !slices.Equal(got, tc.want) {
				t.Fatalf("unknown annotations %v, want %v", got, tc.want)
			}
		})
	}
}
