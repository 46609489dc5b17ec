package config

import (
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func lifetimeService(kv ...string) *v1.Service {
	s := &v1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web", Annotations: map[string]string{}}}
	for i := 0; i+1 < len(kv); i += 2 {
		s.Annotations[kv[i]] = kv[i+1]
	}
	return s
}

func TestParseConnectionLifetime(t *testing.T) {
	for _, tc := range []struct {
		name    string
		ann     []string
		want    ConnectionLifetime
		wantErr string
	}{
		{"none", nil, ConnectionLifetime{}, ""},
		{"age", []string{MaxConnectionAgeAnnotation, "5m"}, ConnectionLifetime{MaxAge: 5 * time.Minute, MaxAgeSet: true}, ""},
		{"age off", []string{MaxConnectionAgeAnnotation, "0"}, ConnectionLifetime{MaxAgeSet: true}, ""},
		{"drain", []string{DrainRemovedAnnotation, "30s"}, ConnectionLifetime{Drain: 30 * time.Second}, ""},
		{"both", []string{MaxConnectionAgeAnnotation, "1h", DrainRemovedAnnotation, "1m30s"}, ConnectionLifetime{MaxAge: time.Hour, MaxAgeSet: true, Drain: 90 * time.Second}, ""},
		{"not a duration", []string{MaxConnectionAgeAnnotation, "5x"}, ConnectionLifetime{},
			`metadata.annotations[kube-userspace-proxy/max-connection-age]: "5x" is not a duration`},
		{"no unit", []string{DrainRemovedAnnotation, "30"}, ConnectionLifetime{},
			`metadata.annotations[kube-userspace-proxy/drain-removed]: "30" is not a duration`},
		{"negative", []string{DrainRemovedAnnotation, "-1s"}, ConnectionLifetime{},
			`metadata.annotations[kube-userspace-proxy/drain-removed]: "-1s" must not be negative`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseConnectionLifetime(lifetimeService(tc.ann...))
			switch {
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Fatalf("error %v, want one containing %q", err, tc.wantErr)
			case tc.wantErr == "" && err != nil:
				t.Fatalf("error %v", err)
			case got != tc.want:
				t.Fatalf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}
