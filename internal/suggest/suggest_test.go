package suggest

import (
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestDistance(t *testing.T) {
	for _, tc := range []struct {
		a, b string
		want int
	}{
		{"Service", "Service", 0}, {"Servce", "Service", 1}, {"Servcie", "Service", 1},
		{"Device", "Service", 2}, {"", "abc", 3}, {"bind-adress", "bind-address", 1},
	} {
		if got := Distance(tc.a, tc.b); got != tc.want {
			t.Errorf("Distance(%q, %q) = %d, want %d", tc.a, tc.b, got, tc.want)
		}
	}
}

func TestClosest(t *testing.T) {
	flags := []string{"bind-address", "node-ip", "healthz-bind-address", "metrics-bind-address", "v"}
	for _, tc := range []struct{ word, want string }{
		{"bind-adress", "bind-address"},
		{"BIND-ADDRESS", "bind-address"},
		{"nodeip", "node-ip"},
		{"node-ips", "node-ip"},
		{"x", "v"},      // one edit for a short word
		{"nod", ""},     // two edits: too many for a short word
		{"cleanup", ""}, // nothing near
		{"bind-adres", "bind-address"},
	} {
		if got := Closest(tc.word, flags); got != tc.want {
			t.Errorf("Closest(%q) = %q, want %q", tc.word, got, tc.want)
		}
	}
	if got := Closest("ab", []string{"aa", "bb"}); got != "" {
		t.Errorf("a tie gave %q", got)
	}
}

func TestJSONFields(t *testing.T) {
	type inner struct {
		SyncPeriod string `json:"syncPeriod"`
		MinSync    string `json:"minSyncPeriod,omitempty"`
	}
	type meta struct {
		Kind string `json:"kind"`
	}
	type cfg struct {
		meta     `json:",inline"`
		Bind     string  `json:"bindAddress"`
		IPTables *inner  `json:"iptables"`
		List     []inner `json:"list"`
		Skip     string  `json:"-"`
	}
	if got := JSONFields(reflect.TypeOf(cfg{}), nil); !slices.Equal(got, []string{"kind", "bindAddress", "iptables", "list"}) {
		t.Errorf("top level: %v", got)
	}
	for _, path := range [][]string{{"iptables"}, {"list"}} {
		if got := JSONFields(reflect.TypeOf(&cfg{}), path); !slices.Equal(got, []string{"syncPeriod", "minSyncPeriod"}) {
			t.Errorf("%v: %v", path, got)
		}
	}
	if got := JSONFields(reflect.TypeOf(cfg{}), []string{"bindAddress"}); got != nil {
		t.Errorf("a string's fields: %v", got)
	}
	// A struct that embeds a non-struct, as metav1.Duration embeds
	// time.Duration: no fields, no panic (FuzzConfigFile found
	// "iptables: {syncPeriod.x: ...}" panicking in NumField).
	type duration struct{ time.Duration }
	type withDuration struct {
		Period duration `json:"period"`
	}
	if got := JSONFields(reflect.TypeOf(withDuration{}), []string{"period"}); len(got) != 0 {
		t.Errorf("an embedded time.Duration's fields: %v", got)
	}
}

func TestFieldType(t *testing.T) {
	type port struct {
		Port int32 `json:"port"`
	}
	type spec struct {
		Ports    []port            `json:"ports"`
		Selector map[string]string `json:"selector"`
		Timeout  *int32            `json:"timeout"`
	}
	type svc struct {
		Spec spec `json:"spec"`
	}
	for _, tc := range []struct {
		path string
		want string
	}{
		{"spec.ports.port", "int32"},
		{"spec.ports", "[]suggest.port"},
		{"spec.selector", "map[string]string"},
		{"spec.timeout", "int32"},
		{"spec.nope", ""},
	} {
		got, ok := FieldType(reflect.TypeOf(&svc{}), strings.Split(tc.path, "."))
		switch {
		case !ok && tc.want != "":
			t.Errorf("FieldType(%s) found nothing, want %s", tc.path, tc.want)
		case ok && got.String() != tc.want:
			t.Errorf("FieldType(%s) = %s, want %s", tc.path, got, tc.want)
		}
	}
}
