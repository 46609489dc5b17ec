package faults

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
)

// Annotation declares a Service's toxics: a JSON list in Toxiproxy's shape.
const Annotation = "kube-userspace-proxy/faults"

// ServicePort is what the parser needs to know of a Service port.
type ServicePort struct {
	Name     string
	Number   int32
	Protocol string // TCP or UDP
}

// ParseAnnotation parses and checks a faults annotation against the
// Service's ports. It returns the toxics of each port, keyed by port name.
// A toxic without "port" applies to every port its type can act on; one
// that names a port of the wrong protocol, or matches no port, is an
// error. Errors name the field: "[1].attributes.latency: ...".
func ParseAnnotation(value string, ports []ServicePort) (map[string][]Toxic, error) {
	var raw []json.RawMessage
	if err := json.Unmarshal([]byte(value), &raw); err != nil {
		return nil, fmt.Errorf("not a JSON list of toxics: %v", err)
	}
	out := map[string][]Toxic{}
	names := map[string]bool{}
	for i, r := range raw {
		at := func(err error) error {
			if fe, ok := err.(*FieldError); ok {
				return fmt.Errorf("[%d].%s", i, fe.Error())
			}
			return fmt.Errorf("[%d]: %v", i, err)
		}
		var t Toxic
		if err := t.UnmarshalJSON(bytes.TrimSpace(r)); err != nil {
			return nil, at(err)
		}
		if err := t.Normalize(); err != nil {
			return nil, at(err)
		}
		if names[t.Name] {
			return nil, at(&FieldError{"name", fmt.Sprintf("%q is used twice; toxic names must be unique", t.Name)})
		}
		names[t.Name] = true
		// A number can name two ports (DNS: 53/TCP and 53/UDP); the toxic
		// goes to those its type acts on, and is wrong only if none is.
		matched, wrongProtocol := 0, ""
		for _, p := range ports {
			if t.Port != "" && string(t.Port) != p.Name && string(t.Port) != strconv.Itoa(int(p.Number)) {
				continue
			}
			if !t.AppliesTo(p.Protocol) {
				wrongProtocol = p.Protocol
				continue
			}
			matched++
			out[p.Name] = append(out[p.Name], t.clone())
		}
		if matched == 0 {
			switch {
			case t.Port != "" && wrongProtocol != "":
				return nil, at(&FieldError{"type", fmt.Sprintf("%s acts on %s, and port %q is %s", t.Type, protocolsOf(t.Type), t.Port, wrongProtocol)})
			case t.Port != "":
				return nil, at(&FieldError{"port", fmt.Sprintf("the Service has no port %q", t.Port)})
			}
			return nil, at(&FieldError{"type", fmt.Sprintf("%s acts on %s, and the Service has no such port", t.Type, protocolsOf(t.Type))})
		}
	}
	return out, nil
}
