package faults

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"net/netip"
	"reflect"
	"slices"
	"sort"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/internal/clip"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/internal/netaddr"
)

// Toxic is one fault in Toxiproxy's JSON shape, so its examples can be
// copied, plus our fields: Port (a port name or number; empty = every port
// of the Service), Clients (CIDRs; empty = every client) and Seed (overrides
// --fault-seed for this toxic).
type Toxic struct {
	Name       string             `json:"name"`
	Type       string             `json:"type"`
	Stream     string             `json:"stream"`
	Toxicity   float32            `json:"toxicity"`
	Attributes map[string]float64 `json:"attributes"`
	Port       PortRef            `json:"port,omitempty"`
	Clients    []string           `json:"clients,omitempty"`
	Seed       *int64             `json:"seed,omitempty"`
}

// Streams, as Toxiproxy names them: upstream is client→backend.
const (
	Upstream   = "upstream"
	Downstream = "downstream"
)

// PortRef is a port name or number; JSON accepts either form.
type PortRef string

func (p *PortRef) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	if string(b) == "null" {
		// As absent, not as port 0.
		*p = ""
		return nil
	}
	if len(b) > 0 && b[0] == '"' {
		var s string
		if err := json.Unmarshal(b, &s); err != nil {
			return err
		}
		*p = PortRef(s)
		return nil
	}
	var n int
	if err := json.Unmarshal(b, &n); err != nil {
		return &FieldError{"port", fmt.Sprintf("must be a port name or number, not %s", clip.String(string(b)))}
	}
	*p = PortRef(strconv.Itoa(n))
	return nil
}

// UnmarshalJSON applies Toxiproxy's defaults: toxicity 1, stream downstream.
// It reads and drops "origin", which the fault API adds to every toxic it
// lists, so that a toxic copied from that list can be declared as it is
// (set live, then declared); the origin of a declared toxic is the
// annotation's. An attribute given as null is not given (givenAttributes).
func (t *Toxic) UnmarshalJSON(b []byte) error {
	type plain Toxic
	v := struct {
		plain
		Attributes map[string]*float64 `json:"attributes"` // shadows plain's
		Origin     *string             `json:"origin"`
	}{plain: plain{Toxicity: 1, Stream: Downstream}}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&v); err != nil {
		return fieldOf(err, b)
	}
	*t = Toxic(v.plain)
	t.Attributes = givenAttributes(t.Type, v.Attributes)
	return nil
}

// givenAttributes drops the attributes given as JSON null: null is not
// given, as in Toxiproxy, whose decode into the toxic's struct leaves a
// field as it is on null, so a new toxic takes the type's default and an
// update keeps the value (its Go client sends a nil attribute as null;
// read as 0 here, it set a jitter of 10 to 0, and a loss toxic's rate to
// 0 where its default is 1). A null one that is not an attribute of typ
// is kept, as 0, for Normalize to refuse: a misspelt name stays an error.
func givenAttributes(typ string, attrs map[string]*float64) map[string]float64 {
	if attrs == nil {
		return nil
	}
	out := make(map[string]float64, len(attrs))
	for k, v := range attrs {
		switch {
		case v != nil:
			out[k] = *v
		case !isAttributeOf(typ, k):
			out[k] = 0
		}
	}
	return out
}

// isAttributeOf tells an attribute of typ, in any case (canonicalAttributes).
func isAttributeOf(typ, name string) bool {
	for n := range toxicTypes[typ].attrs {
		if strings.EqualFold(n, name) {
			return true
		}
	}
	return false
}

// MaxNameLength is the longest toxic name, in bytes: a Kubernetes object
// name's bound (a name is a label value of faults_injected_total).
const MaxNameLength = 253

// toxicFields are the JSON fields of a toxic, for "unknown field" errors.
const toxicFields = "name, type, stream, toxicity, attributes, port, clients, seed"

// fieldOf turns encoding/json's errors into FieldErrors, so a wrong type
// or a misspelt field is named as Normalize names a wrong value
// ("toxicity: ...", "attributes.latency: ...") instead of in Go terms
// ("Go struct field plain.toxicity of type float32").
func fieldOf(err error, b []byte) error {
	var te *json.UnmarshalTypeError
	switch {
	case errors.As(err, &te) && te.Field == "":
		// The whole toxic is not an object ([1], [[]]): encoding/json's text
		// named the Go type it decodes into.
		return fmt.Errorf("a toxic must be a JSON object {\"name\": ..., \"type\": ...}, not a JSON %s", te.Value)
	case errors.As(err, &te) && te.Field != "":
		field := te.Field
		if i := strings.LastIndex(field, "plain."); i >= 0 {
			field = field[i+len("plain."):]
		}
		if field == "attributes" {
			// Name the attribute: encoding/json stops at the map.
			var attrs struct {
				Attributes map[string]json.RawMessage `json:"attributes"`
			}
			if json.Unmarshal(b, &attrs) == nil {
				for _, k := range slices.Sorted(maps.Keys(attrs.Attributes)) {
					var f float64
					if json.Unmarshal(attrs.Attributes[k], &f) != nil {
						return &FieldError{"attributes." + k, fmt.Sprintf("must be a number, not %s", clip.String(string(attrs.Attributes[k])))}
					}
				}
			}
		}
		if v, ok := strings.CutPrefix(te.Value, "number "); ok && te.Type.Kind() == reflect.Float32 {
			// Beyond float32's range, so beyond toxicity's [0, 1] (the one
			// float32 field): worded as Normalize words 1.5, where "must be
			// a JSON number, not a JSON number 1e40" contradicted itself.
			return &FieldError{field, fmt.Sprintf("must be within [0, 1], not %s", clip.String(v))}
		}
		if v, ok := strings.CutPrefix(te.Value, "number "); ok && isInteger(te.Type.Kind()) {
			// A number, but a fraction or out of range: "must be a JSON
			// number, not a JSON number 1.5" said nothing.
			return &FieldError{field, fmt.Sprintf("must be a whole number within %s's range, not %s", te.Type.Kind(), clip.String(v))}
		}
		return &FieldError{field, fmt.Sprintf("must be a JSON %s, not a JSON %s", jsonKind(te.Type.Kind()), te.Value)}
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		name, _ := strconv.Unquote(strings.TrimPrefix(err.Error(), "json: unknown field "))
		return &FieldError{name, "unknown field (a toxic has " + toxicFields + ")"}
	}
	return err
}

func isInteger(k reflect.Kind) bool {
	switch k {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return true
	}
	return false
}

func jsonKind(k reflect.Kind) string {
	switch k {
	case reflect.String:
		return "string"
	case reflect.Slice:
		return "list"
	case reflect.Map, reflect.Struct:
		return "object"
	case reflect.Bool:
		return "boolean"
	}
	return "number"
}

// kind says where a toxic acts.
type kind int

const (
	kindStream   kind = iota // TCP, on a direction's bytes
	kindConnect              // TCP, before any backend is dialled
	kindDatagram             // UDP, per datagram
	kindBoth                 // TCP stream and UDP datagram (latency)
	kindDown                 // the port refuses and cuts (TCP) or drops (UDP)
	kindNoop                 // acts on nothing (TCP and UDP)
)

// toxicType describes one type: where it acts, its attributes with their
// defaults (Toxiproxy's units: ms, KB/s, bytes, µs for slicer delay).
type toxicType struct {
	kind  kind
	attrs map[string]float64
}

var toxicTypes = map[string]toxicType{
	"latency":    {kindBoth, map[string]float64{"latency": 0, "jitter": 0}},
	"bandwidth":  {kindStream, map[string]float64{"rate": 0}},
	"slow_close": {kindStream, map[string]float64{"delay": 0}},
	"timeout":    {kindStream, map[string]float64{"timeout": 0}},
	"reset_peer": {kindStream, map[string]float64{"timeout": 0}},
	"slicer":     {kindStream, map[string]float64{"average_size": 0, "size_variation": 0, "delay": 0}},
	"limit_data": {kindStream, map[string]float64{"bytes": 0}},
	"down":       {kindDown, map[string]float64{}},
	// noop is Toxiproxy's toxic that passes everything through: suites and
	// clients add it as a placeholder, and refused it failed them.
	"noop":          {kindNoop, map[string]float64{}},
	"refuse":        {kindConnect, map[string]float64{}},
	"connect_delay": {kindConnect, map[string]float64{"delay": 0, "jitter": 0}},
	// loss: rate, or a Gilbert-Elliott burst model (p: good→bad, r:
	// bad→good, loss_bad / loss_good: loss in each state), tc-netem's gemodel.
	"loss":      {kindDatagram, map[string]float64{"rate": 1, "p": 0, "r": 1, "loss_bad": 1, "loss_good": 0}},
	"duplicate": {kindDatagram, map[string]float64{"rate": 1}},
	"reorder":   {kindDatagram, map[string]float64{"rate": 1, "delay": 10}},
}

// byteCounts are the attributes that count bytes: Toxiproxy's integers,
// which a fraction would not fit (limit_data's 1.5 bytes passed 1). The
// others are durations and rates, where a fraction means what it says.
var byteCounts = map[string][]string{
	"limit_data": {"bytes"},
	"slicer":     {"average_size", "size_variation"},
}

// Types lists the toxic types this proxy knows.
func Types() []string {
	out := make([]string, 0, len(toxicTypes))
	for k := range toxicTypes {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// maxAttribute bounds every attribute: as a duration (ms; µs for slicer's
// delay) it still fits time.Duration (1e12 ms is 31 years), where a larger
// one overflowed to a negative duration and did the opposite (a reset_peer
// timeout of 1e13 ms reset at once). As bytes it is a terabyte.
const maxAttribute = 1e12

// minBandwidth is the slowest bandwidth toxic, in KB/s: a byte a second.
// A slower rate paced a chunk past time.Duration's range.
const minBandwidth = 0.001

// FieldError names the field of a toxic that is wrong, so users see
// exactly what to fix ("[1].attributes.latency: ...").
type FieldError struct {
	Field  string
	Reason string
}

// Error bounds the field's name, which may be one the user gave (an
// attribute's, an unknown field's): see clip.
func (e *FieldError) Error() string { return clip.String(e.Field) + ": " + e.Reason }

// Normalize checks t and fills its defaults (name, attribute defaults).
// It does not know the port's protocol; see AppliesTo.
func (t *Toxic) Normalize() error {
	tt, ok := toxicTypes[t.Type]
	if !ok {
		if t.Type == "" {
			return &FieldError{"type", "required"}
		}
		return &FieldError{"type", fmt.Sprintf("unknown toxic type %s (known: %s)", clip.Quote(t.Type), strings.Join(Types(), ", "))}
	}
	// Toxiproxy reads the direction case-insensitively, and names a
	// toxic by the stream as given ("latency_UpStream"): a client that
	// deletes by that name must find it.
	given := t.Stream
	switch t.Stream = strings.ToLower(t.Stream); t.Stream {
	case "":
		t.Stream, given = Downstream, Downstream
	case Upstream, Downstream:
	default:
		return &FieldError{"stream", fmt.Sprintf("must be %q or %q, not %s", Upstream, Downstream, clip.Quote(t.Stream))}
	}
	if t.Name == "" {
		t.Name = t.Type + "_" + given
	}
	if i, r, ok := firstUnprintable(t.Name); ok {
		// Names are printed for operators (/debug/connections?format=text,
		// logs): an ESC sequence or a newline there cleared their terminal
		// or forged a row. Toxiproxy takes any string; no client needs these.
		return &FieldError{"name", fmt.Sprintf("must be printable, not %s (%U at byte %d)", clip.Quote(t.Name), r, i)}
	}
	if len(t.Name) > MaxNameLength {
		// A name is a label value of faults_injected_total: a name of a
		// megabyte made /metrics a megabyte.
		return &FieldError{"name", fmt.Sprintf("at most %d bytes, not %d (a name is a metric label)", MaxNameLength, len(t.Name))}
	}
	if !(t.Toxicity >= 0 && t.Toxicity <= 1) { // NaN too
		return &FieldError{"toxicity", fmt.Sprintf("must be within [0, 1], not %v", t.Toxicity)}
	}
	if t.Toxicity == 0 {
		// -0 (JSON's "-0", "-0.0") is 0: shown back as "-0" it read as
		// something other than what any client means.
		t.Toxicity = 0
	}
	canonical, err := canonicalAttributes(t.Type, t.Attributes)
	if err != nil {
		return err
	}
	t.Attributes = canonical
	attrs := make(map[string]float64, len(tt.attrs))
	for k, v := range tt.attrs {
		attrs[k] = v
	}
	for k, v := range t.Attributes {
		if _, ok := tt.attrs[k]; !ok {
			names := make([]string, 0, len(tt.attrs))
			for n := range tt.attrs {
				names = append(names, n)
			}
			if len(names) == 0 {
				return &FieldError{"attributes." + k, fmt.Sprintf("%s takes no attributes", t.Type)}
			}
			sort.Strings(names)
			return &FieldError{"attributes." + k, fmt.Sprintf("not an attribute of %s (known: %s)", t.Type, strings.Join(names, ", "))}
		}
		if v < 0 {
			return &FieldError{"attributes." + k, fmt.Sprintf("must not be negative, not %v", v)}
		}
		if !(v <= maxAttribute) { // NaN too
			return &FieldError{"attributes." + k, fmt.Sprintf("must be at most %g, not %v", float64(maxAttribute), v)}
		}
		if v == 0 {
			v = 0 // -0 is 0, as toxicity's
		}
		attrs[k] = v
	}
	for _, k := range []string{"rate", "p", "r", "loss_bad", "loss_good"} {
		if tt.kind == kindDatagram && attrs[k] > 1 {
			return &FieldError{"attributes." + k, fmt.Sprintf("is a probability, must be within [0, 1], not %v", attrs[k])}
		}
	}
	if t.Type == "loss" {
		if err := lossModel(t.Attributes, attrs); err != nil {
			return err
		}
	}
	// 0 holds the stream, as in Toxiproxy; between 0 and a byte a second
	// the pacing would overflow its durations.
	if r := attrs["rate"]; t.Type == "bandwidth" && r != 0 && r < minBandwidth {
		return &FieldError{"attributes.rate", fmt.Sprintf("must be 0 (hold the stream) or at least %g (KB/s: a byte a second), not %v", minBandwidth, r)}
	}
	for _, k := range byteCounts[t.Type] {
		if v := attrs[k]; v != math.Trunc(v) {
			return &FieldError{"attributes." + k, fmt.Sprintf("must be a whole number of bytes, not %v", v)}
		}
	}
	if t.Type == "slicer" && attrs["average_size"] == 0 {
		return &FieldError{"attributes.average_size", "must be greater than 0 (bytes)"}
	}
	t.Attributes = attrs
	for i, c := range t.Clients {
		if _, err := parseClient(c); err != nil {
			return &FieldError{fmt.Sprintf("clients[%d]", i), err.Error()}
		}
	}
	return nil
}

// canonicalAttributes returns attrs with each attribute named as typ
// spells it. Toxiproxy decodes attributes into the toxic's Go struct,
// whose field names encoding/json matches in any case, so its clients may
// send "Latency" for latency: the .NET ones (rabbitmq/toxiproxy-netcore)
// serialize PascalCase, and every toxic they added was refused here as
// an unknown attribute. A name that is not one of typ's is kept as given,
// for Normalize to refuse; one attribute given under two spellings is
// refused, since the map does not keep which came last (Toxiproxy takes
// the last).
func canonicalAttributes(typ string, attrs map[string]float64) (map[string]float64, error) {
	tt, ok := toxicTypes[typ]
	if !ok || len(attrs) == 0 {
		return attrs, nil
	}
	out := make(map[string]float64, len(attrs))
	spelt := make(map[string]string, len(attrs))
	for _, k := range slices.Sorted(maps.Keys(attrs)) {
		name := k
		if _, known := tt.attrs[k]; !known {
			for n := range tt.attrs {
				if strings.EqualFold(n, k) {
					name = n
					break
				}
			}
		}
		if first, dup := spelt[name]; dup {
			return nil, &FieldError{"attributes." + name, fmt.Sprintf("given twice, as %s and %s", clip.Quote(first), clip.Quote(k))}
		}
		spelt[name] = k
		out[name] = attrs[k]
	}
	return out, nil
}

// lossModel refuses a loss toxic that mixes its two models: rate is
// random loss; p, r, loss_bad and loss_good are tc-netem's Gilbert-Elliott
// model, which acts when p > 0. Mixed, rate was silently ignored (rate 0.5
// with p 0.1 lost 9 %, not 50 %). A Gilbert-Elliott toxic shows no rate,
// so it reads back as what acts (and passes this check again); a random
// one shows p 0 and the inert Gilbert-Elliott defaults.
func lossModel(given, attrs map[string]float64) error {
	if attrs["p"] == 0 {
		// Gilbert-Elliott attributes without p > 0 left random loss at
		// its default rate 1: every datagram lost (p 0, r 0.5,
		// loss_good 0.01 lost 300 of 300).
		_, rateGiven := given["rate"]
		for _, k := range []string{"r", "loss_bad", "loss_good"} {
			if _, ok := given[k]; ok && !rateGiven {
				return &FieldError{"attributes.p", fmt.Sprintf("%s is the Gilbert-Elliott model's, which acts only with p > 0 (the chance of entering the bad state); with p 0 the toxic is random loss at rate, whose default 1 loses every datagram: give p > 0, or rate", k)}
			}
		}
		return nil
	}
	if _, ok := given["rate"]; ok {
		return &FieldError{"attributes.rate", "random loss (rate) and the Gilbert-Elliott model (p > 0) exclude each other: give rate, or p with r, loss_bad and loss_good"}
	}
	delete(attrs, "rate")
	return nil
}

// parseClient reads a CIDR or an IP. An IPv4 CIDR in its IPv4-mapped form
// (::ffff:10.0.0.0/104) is the IPv4 one: clients are compared unmapped.
func parseClient(s string) (netip.Prefix, error) {
	if p, err := netip.ParsePrefix(s); err == nil {
		unmapped, ok := netaddr.UnmapPrefix(p)
		if !ok {
			return netip.Prefix{}, fmt.Errorf("%s is an IPv4-mapped CIDR shorter than /96, which spans more than IPv4", clip.Quote(s))
		}
		return unmapped, nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("%s is not a CIDR or an IP", clip.Quote(s))
	}
	return netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen()), nil
}

// AppliesTo reports whether a normalized toxic of this type can act on a
// port of the protocol ("TCP" or "UDP").
func (t *Toxic) AppliesTo(protocol string) bool {
	switch toxicTypes[t.Type].kind {
	case kindStream, kindConnect:
		return protocol == "TCP"
	case kindDatagram:
		return protocol == "UDP"
	}
	// SCTP has no proxy socket: a toxic there would be listed and do nothing.
	return protocol == "TCP" || protocol == "UDP"
}

// othersFor is said after a type refused on a port of the protocol: the
// types that act there, so that a test's author who asked for reset_peer
// on a UDP port learns what UDP has ("" for a protocol no toxic acts on).
func othersFor(protocol string) string {
	var names []string
	for name := range toxicTypes {
		if t := (Toxic{Type: name}); t.AppliesTo(protocol) {
			names = append(names, name)
		}
	}
	if len(names) == 0 {
		return ""
	}
	slices.Sort(names)
	return fmt.Sprintf(" (a %s port takes %s)", protocol, strings.Join(names, ", "))
}

// protocolsOf says which protocols a type acts on, for error messages.
func protocolsOf(typ string) string {
	switch toxicTypes[typ].kind {
	case kindStream, kindConnect:
		return "TCP"
	case kindDatagram:
		return "UDP"
	}
	return "TCP and UDP"
}

func (t Toxic) clone() Toxic {
	c := t
	c.Attributes = make(map[string]float64, len(t.Attributes))
	for k, v := range t.Attributes {
		c.Attributes[k] = v
	}
	c.Clients = slices.Clone(t.Clients)
	return c
}

// firstUnprintable finds the first rune of s that is not printable (a
// control or format character, a space other than ' ', or invalid UTF-8).
func firstUnprintable(s string) (at int, r rune, found bool) {
	for i, r := range s {
		if r == utf8.RuneError || !unicode.IsPrint(r) {
			return i, r, true
		}
	}
	return 0, 0, false
}
