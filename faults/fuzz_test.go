package faults

import (
	"strings"
	"testing"
)

// FuzzParseAnnotation: no input panics, and every input either parses into
// toxics that pass their own checks or fails with an error that says
// where ("[i]..." or "not a JSON list").
func FuzzParseAnnotation(f *testing.F) {
	for _, seed := range []string{
		`[{"name":"slow","type":"latency","stream":"downstream","toxicity":1.0,"attributes":{"latency":300,"jitter":0}}]`,
		`[{"type":"reset_peer","port":"http","clients":["10.0.0.0/8"]}]`,
		`[{"type":"loss","port":53,"attributes":{"p":0.1,"r":0.5}}]`,
		`[{"type":"slicer","attributes":{"average_size":0}}]`,
		`[{"type":"bandwidth","attributes":{"rate":-1}}]`,
		`{"type":"latency"}`,
		`[]`,
		``,
	} {
		f.Add(seed)
	}
	ports := []ServicePort{{Name: "http", Number: 80, Protocol: "TCP"}, {Name: "dns", Number: 53, Protocol: "UDP"}}
	f.Fuzz(func(t *testing.T, value string) {
		byPort, err := ParseAnnotation(value, ports)
		if err != nil {
			if msg := err.Error(); !strings.HasPrefix(msg, "[") && !strings.HasPrefix(msg, "not a JSON list") {
				t.Fatalf("error does not say where: %q", msg)
			}
			return
		}
		for name, toxics := range byPort {
			proto := "TCP"
			if name == "dns" {
				proto = "UDP"
			}
			for _, tx := range toxics {
				if !tx.AppliesTo(proto) {
					t.Fatalf("%s toxic given to %s port %s", tx.Type, proto, name)
				}
				again := tx.clone()
				if err := again.Normalize(); err != nil {
					t.Fatalf("parsed toxic fails its own check: %v", err)
				}
			}
		}
	})
}
