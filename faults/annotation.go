package faults

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/internal/clip"
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
	if strings.TrimSpace(value) == "" {
		// `kubectl annotate svc X kube-userspace-proxy/faults=` clears the
		// faults, as removing the annotation, null and [] do; read as
		// invalid JSON, it kept the last faults in force.
		return map[string][]Toxic{}, nil
	}
	var raw []json.RawMessage
	if err := json.Unmarshal([]byte(value), &raw); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			// encoding/json's text named the Go type it decodes into.
			hint := ""
			if te.Value == "object" {
				hint = "; put a single toxic in a list, [{...}]"
			}
			return nil, fmt.Errorf("not a JSON list of toxics: a JSON %s%s", te.Value, hint)
		}
		if t := strings.TrimLeft(value, " \t\r\n"); len(t) > 1 && t[0] == '-' && strings.ContainsRune(" \t\r\n", rune(t[1])) {
			// "- name: slow": YAML, what the rest of the manifest is
			// written in; encoding/json read it as a number and said
			// "invalid character ' ' in numeric literal".
			return nil, errors.New(`not a JSON list of toxics: it reads as a YAML list ("- ..."); write it in JSON, as Toxiproxy's: [{"name":"slow","type":"latency","attributes":{"latency":300}}]`)
		}
		var se *json.SyntaxError
		if errors.As(err, &se) {
			return nil, fmt.Errorf("not a JSON list of toxics: %s: %v", syntaxErrorAt(value, se.Offset), err)
		}
		return nil, fmt.Errorf("not a JSON list of toxics: %v", err)
	}
	out := map[string][]Toxic{}
	// The names given on each port so far: walking the port's toxics for
	// each new one made the parse quadratic, and it runs under the
	// proxier's lock (8,000 toxics on 100 ports, under the API server's
	// 256 KiB, took 83 s).
	names := map[string]map[string]bool{}
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
		// Where the toxic goes is checked before its attributes: a slicer
		// without average_size on a UDP port was told of the attribute,
		// and of the protocol only once that was fixed. (A type unknown
		// is Normalize's error.)
		if _, known := toxicTypes[t.Type]; known {
			if err := portsFor(&t, ports); err != nil {
				return nil, at(err)
			}
		}
		if err := t.Normalize(); err != nil {
			return nil, at(err)
		}
		for _, p := range ports {
			if !selects(&t, p) || !t.AppliesTo(p.Protocol) {
				continue
			}
			// Names are per port, as each port is its own proxy in the
			// API: "slow" on port http and "slow" on port admin are two
			// toxics; twice on one port (a toxic for every port and one
			// for this port too) is an error.
			if names[p.Name][t.Name] {
				return nil, at(&FieldError{"name", fmt.Sprintf("%q is used twice on port %q; toxic names must be unique per port", t.Name, p.Name)})
			}
			if names[p.Name] == nil {
				names[p.Name] = map[string]bool{}
			}
			if len(out[p.Name]) == MaxAnnotationToxicsPerPort {
				return nil, at(fmt.Errorf("port %q would have %d toxics; the annotation declares at most %d per port",
					p.Name, MaxAnnotationToxicsPerPort+1, MaxAnnotationToxicsPerPort))
			}
			names[p.Name][t.Name] = true
			out[p.Name] = append(out[p.Name], t.clone())
		}
	}
	return out, nil
}

// syntaxErrorNear is how much of the line before a JSON syntax error
// syntaxErrorAt shows.
const syntaxErrorNear = 24

// syntaxErrorAt says where a JSON syntax error is in value, offset being
// encoding/json's (the position of the byte it stopped at, from 1): its
// line and column, and the text of that line up to and including that
// byte. encoding/json's text alone ("invalid character '"' after object
// key:value pair") left the user to search a block of toxics for it.
func syntaxErrorAt(value string, offset int64) string {
	bad := int(min(max(offset, 1), int64(len(value)))) - 1
	lineStart := strings.LastIndexByte(value[:bad], '\n') + 1
	line := 1 + strings.Count(value[:lineStart], "\n")
	from := max(lineStart, bad-syntaxErrorNear)
	near := value[from:min(bad+1, len(value))]
	if i := strings.IndexAny(near, ",{[ "); from > lineStart && i >= 0 && i < len(near)-1 {
		near = near[i+1:] // from a token's start, not the middle of one
	}
	quoted := "`" + near + "`"
	if !strconv.CanBackquote(near) {
		// A control character or a backquote: escaped, so that the log
		// line shows what is there and nothing else.
		quoted = strconv.Quote(near)
	}
	return fmt.Sprintf("line %d, column %d, at the end of %s", line, bad-lineStart+1, quoted)
}

// selects reports whether t's port field (absent: every port) names p.
func selects(t *Toxic, p ServicePort) bool {
	return t.Port == "" || string(t.Port) == p.Name || string(t.Port) == strconv.Itoa(int(p.Number))
}

// portsFor checks that t, of a known type, goes to some port: one its port
// field names whose protocol its type acts on. A number can name two ports
// (DNS: 53/TCP and 53/UDP); the toxic goes to those its type acts on, and
// is wrong only if none is.
func portsFor(t *Toxic, ports []ServicePort) error {
	wrongProtocol := ""
	for _, p := range ports {
		if !selects(t, p) {
			continue
		}
		if t.AppliesTo(p.Protocol) {
			return nil
		}
		// One whose types the error can list (othersFor), whatever the
		// order of the ports: an SCTP port, which takes none, after a UDP
		// one hid what the UDP port takes.
		if wrongProtocol == "" || othersFor(wrongProtocol) == "" {
			wrongProtocol = p.Protocol
		}
	}
	switch {
	case t.Port != "" && wrongProtocol != "":
		return &FieldError{"type", fmt.Sprintf("%s acts on %s, and port %s is %s%s", t.Type, protocolsOf(t.Type), clip.Quote(string(t.Port)), wrongProtocol, othersFor(wrongProtocol))}
	case t.Port != "":
		return &FieldError{"port", fmt.Sprintf("the Service has no port %s", clip.Quote(string(t.Port)))}
	}
	return &FieldError{"type", fmt.Sprintf("%s acts on %s, and the Service has no such port%s", t.Type, protocolsOf(t.Type), othersFor(wrongProtocol))}
}

// MaxAnnotationToxicsPerPort bounds the toxics the annotation declares on
// one port. Each is a series of faults_injected_total for each port it
// goes to, made when it is declared, and the annotation is whoever may edit
// the Service: 8,000 toxics (247 KB, which the API server takes) on 50
// ports were 400,000 series, a 50 MB /metrics and half a GB in the proxy.
// The fault API (the operator's) adds beyond it.
const MaxAnnotationToxicsPerPort = 100
