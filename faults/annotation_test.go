package faults

import (
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

var (
	tcpHTTP  = ServicePort{Name: "http", Number: 80, Protocol: "TCP"}
	tcpAdmin = ServicePort{Name: "admin", Number: 9090, Protocol: "TCP"}
	udpDNS   = ServicePort{Name: "dns", Number: 53, Protocol: "UDP"}
	tcpDNS   = ServicePort{Name: "dns-tcp", Number: 53, Protocol: "TCP"}
)

// summary is "port:name/type/stream/toxicity" per toxic, ports in a fixed
// order, toxics in order, so a case states what it expects in one line.
func summary(m map[string][]Toxic) string {
	order := []string{"", "http", "admin", "dns", "dns-tcp", "sig"}
	var out []string
	for port := range m {
		if !slices.Contains(order, port) {
			out = append(out, "unexpected port "+port)
		}
	}
	for _, port := range order {
		for _, t := range m[port] {
			out = append(out, port+":"+t.Name+"/"+t.Type+"/"+t.Stream+"/"+strconv.FormatFloat(float64(t.Toxicity), 'g', 3, 32))
		}
	}
	return strings.Join(out, " ")
}

func TestParseAnnotationValid(t *testing.T) {
	for _, tc := range []struct {
		name  string
		value string
		ports []ServicePort
		want  string
	}{
		{
			// Names are per port, as each port is its own proxy in the API:
			// refused as "used twice" across the Service.
			name:  "one name on two ports",
			value: `[{"name":"slow","type":"latency","port":"http","attributes":{"latency":10}},{"name":"slow","type":"latency","port":"admin","attributes":{"latency":20}}]`,
			ports: []ServicePort{tcpHTTP, tcpAdmin},
			want:  "http:slow/latency/downstream/1 admin:slow/latency/downstream/1",
		},
		{
			// `kubectl annotate svc X kube-userspace-proxy/faults=`: no
			// faults, as null and []; it was invalid JSON that kept the
			// last faults.
			name:  "empty value",
			value: " ",
			ports: []ServicePort{tcpHTTP},
			want:  "",
		},
		{
			name:  "loss with rate and Gilbert-Elliott p 0 given",
			value: `[{"type":"loss","attributes":{"rate":0.2,"p":0,"loss_good":0.01}}]`,
			ports: []ServicePort{udpDNS},
			want:  "dns:loss_downstream/loss/downstream/1",
		},
		{
			// The example, as Toxiproxy writes a toxic.
			name:  "issue example",
			value: `[{"name":"slow","type":"latency","stream":"downstream","toxicity":1.0,"attributes":{"latency":300,"jitter":0}}]`,
			ports: []ServicePort{tcpHTTP},
			want:  "http:slow/latency/downstream/1",
		},
		{
			// Set live, then declared: a toxic as our fault API lists it
			// (GET /proxies/{p}/toxics, with its origin), pasted unchanged;
			// the API itself takes it back so.
			name:  "fault API listing",
			value: `[{"name":"slow","type":"latency","stream":"downstream","toxicity":1,"attributes":{"jitter":0,"latency":100},"origin":"api"}]`,
			ports: []ServicePort{tcpHTTP},
			want:  "http:slow/latency/downstream/1",
		},
		{
			// Toxiproxy's README: the body its API returns for a latency
			// toxic, pasted unchanged.
			name:  "toxiproxy README response",
			value: `[{"attributes":{"latency":1000,"jitter":0},"name":"latency_downstream","type":"latency","stream":"downstream","toxicity":1}]`,
			ports: []ServicePort{tcpHTTP},
			want:  "http:latency_downstream/latency/downstream/1",
		},
		{
			// Toxiproxy's README: the body its API accepts, defaults unsaid.
			name:  "toxiproxy README request",
			value: `[{"type" : "latency", "attributes" : {"latency" : 1000}}]`,
			ports: []ServicePort{tcpHTTP},
			want:  "http:latency_downstream/latency/downstream/1",
		},
		{
			name:  "defaults: name from type and stream, toxicity 1, downstream",
			value: `[{"type":"reset_peer"},{"type":"limit_data","stream":"upstream","attributes":{"bytes":10}}]`,
			ports: []ServicePort{tcpHTTP},
			want:  "http:reset_peer_downstream/reset_peer/downstream/1 http:limit_data_upstream/limit_data/upstream/1",
		},
		{
			name:  "explicit toxicity 0 is kept, not defaulted",
			value: `[{"type":"timeout","toxicity":0}]`,
			ports: []ServicePort{tcpHTTP},
			want:  "http:timeout_downstream/timeout/downstream/0",
		},
		{
			name:  "no port: every port",
			value: `[{"type":"latency","toxicity":0.3,"attributes":{"latency":5}}]`,
			ports: []ServicePort{tcpHTTP, tcpAdmin},
			want:  "http:latency_downstream/latency/downstream/0.3 admin:latency_downstream/latency/downstream/0.3",
		},
		{
			name:  "port by name",
			value: `[{"type":"refuse","port":"admin"}]`,
			ports: []ServicePort{tcpHTTP, tcpAdmin},
			want:  "admin:refuse_downstream/refuse/downstream/1",
		},
		{
			name:  "port by number",
			value: `[{"type":"refuse","port":80}]`,
			ports: []ServicePort{tcpHTTP, tcpAdmin},
			want:  "http:refuse_downstream/refuse/downstream/1",
		},
		{
			name:  "port by number as a string",
			value: `[{"type":"refuse","port":"9090"}]`,
			ports: []ServicePort{tcpHTTP, tcpAdmin},
			want:  "admin:refuse_downstream/refuse/downstream/1",
		},
		{
			name:  "unnamed single port, by number",
			value: `[{"type":"slow_close","port":80,"attributes":{"delay":100}}]`,
			ports: []ServicePort{{Number: 80, Protocol: "TCP"}},
			want:  ":slow_close_downstream/slow_close/downstream/1",
		},
		{
			name:  "no port: a type goes only to the ports it can act on",
			value: `[{"type":"loss","attributes":{"rate":0.5}},{"type":"bandwidth","attributes":{"rate":100}},{"type":"latency","attributes":{"latency":1}}]`,
			ports: []ServicePort{tcpHTTP, udpDNS},
			want:  "http:bandwidth_downstream/bandwidth/downstream/1 http:latency_downstream/latency/downstream/1 dns:loss_downstream/loss/downstream/1 dns:latency_downstream/latency/downstream/1",
		},
		{
			// DNS serves 53 over TCP and UDP: a number names both, and each
			// toxic goes to the one its type acts on.
			name:  "a number shared by a TCP and a UDP port",
			value: `[{"type":"loss","port":53},{"type":"refuse","port":53},{"type":"latency","port":53,"attributes":{"latency":1}}]`,
			ports: []ServicePort{udpDNS, tcpDNS},
			want:  "dns:loss_downstream/loss/downstream/1 dns:latency_downstream/latency/downstream/1 dns-tcp:refuse_downstream/refuse/downstream/1 dns-tcp:latency_downstream/latency/downstream/1",
		},
		{
			// SCTP ports have no proxy socket, so they get no toxics.
			name:  "no port: SCTP ports left out",
			value: `[{"type":"latency","attributes":{"latency":1}}]`,
			ports: []ServicePort{tcpHTTP, {Name: "sig", Number: 3868, Protocol: "SCTP"}},
			want:  "http:latency_downstream/latency/downstream/1",
		},
		{
			name:  "UDP toxics on a UDP port",
			value: `[{"type":"loss","attributes":{"p":0.1,"r":0.5}},{"type":"duplicate","stream":"upstream","attributes":{"rate":0.2}},{"type":"reorder","attributes":{"rate":0.1,"delay":5}},{"type":"down"}]`,
			ports: []ServicePort{udpDNS},
			want:  "dns:loss_downstream/loss/downstream/1 dns:duplicate_upstream/duplicate/upstream/1 dns:reorder_downstream/reorder/downstream/1 dns:down_downstream/down/downstream/1",
		},
		{
			// Toxiproxy reads the direction case-insensitively, and
			// names the toxic by the stream as given: a client that
			// deletes latency_UpStream got a 404.
			name:  "stream in any case",
			value: `[{"type":"latency","stream":"UpStream","attributes":{"latency":1}}]`,
			ports: []ServicePort{tcpHTTP},
			want:  "http:latency_UpStream/latency/upstream/1",
		},
		{
			name:  "port null is no port",
			value: `[{"type":"refuse","port":null}]`,
			ports: []ServicePort{tcpHTTP},
			want:  "http:refuse_downstream/refuse/downstream/1",
		},
		{
			name:  "clients: CIDRs and bare addresses",
			value: `[{"type":"reset_peer","clients":["10.0.0.0/8","192.168.1.7","fd00::/8"]}]`,
			ports: []ServicePort{tcpHTTP},
			want:  "http:reset_peer_downstream/reset_peer/downstream/1",
		},
		{
			name:  "empty list",
			value: `[]`,
			ports: []ServicePort{tcpHTTP},
			want:  "",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseAnnotation(tc.value, tc.ports)
			if err != nil {
				t.Fatalf("ParseAnnotation: %v", err)
			}
			if s := summary(got); s != tc.want {
				t.Fatalf("got  %s\nwant %s", s, tc.want)
			}
		})
	}
}

// Attributes not given take their type's default; given ones are kept.
func TestParseAnnotationAttributeDefaults(t *testing.T) {
	got, err := ParseAnnotation(`[
		{"type":"latency","attributes":{"latency":300}},
		{"type":"slicer","stream":"upstream","attributes":{"average_size":64}},
		{"type":"loss","port":"dns"},
		{"name":"bursts","type":"loss","port":"dns","attributes":{"p":0.1}},
		{"type":"connect_delay","port":"http"},
		{"name":"any-case","type":"slicer","port":"http","attributes":{"Average_Size":10,"DELAY":5}}
	]`, []ServicePort{tcpHTTP, udpDNS})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]map[string]float64{
		"latency_downstream":       {"latency": 300, "jitter": 0},
		"slicer_upstream":          {"average_size": 64, "size_variation": 0, "delay": 0},
		"loss_downstream":          {"rate": 1, "p": 0, "r": 1, "loss_bad": 1, "loss_good": 0},
		"bursts":                   {"p": 0.1, "r": 1, "loss_bad": 1, "loss_good": 0}, // Gilbert-Elliott: no rate
		"connect_delay_downstream": {"delay": 0, "jitter": 0},
		// As Toxiproxy reads them (encoding/json into its struct).
		"any-case": {"average_size": 10, "size_variation": 0, "delay": 5},
	}
	seen := 0
	for _, toxics := range got {
		for _, tx := range toxics {
			w, ok := want[tx.Name]
			if !ok {
				continue
			}
			seen++
			if len(tx.Attributes) != len(w) {
				t.Errorf("%s: attributes %v, want %v", tx.Name, tx.Attributes, w)
			}
			for k, v := range w {
				if got, ok := tx.Attributes[k]; !ok || got != v {
					t.Errorf("%s: %s = %v (present %v), want %v", tx.Name, k, got, ok, v)
				}
			}
		}
	}
	// latency goes to both ports.
	if seen != 7 {
		t.Fatalf("saw %d toxics, want 7: %v", seen, got)
	}
}

// Every error names the toxic's index and the field to fix.
func TestParseAnnotationErrors(t *testing.T) {
	both := []ServicePort{tcpHTTP, udpDNS}
	for _, tc := range []struct {
		name  string
		value string
		ports []ServicePort
		want  string // a substring of the error; the field path comes first
	}{
		{"not JSON", `latency please`, both, "not a JSON list of toxics"},
		// In the user's terms, not Go's ("cannot unmarshal object into Go
		// value of type []json.RawMessage").
		// Where, as every other error says which toxic and field: the
		// README's annotation is a block of one toxic per line, and
		// encoding/json's text alone ("invalid character '"' after object
		// key:value pair") left the user to search all of it.
		{"a comma missing, line 2", "[{\"name\":\"a\",\"type\":\"latency\"},\n {\"name\":\"b\",\"type\":\"latency\" \"attributes\":{}}]", both,
			"not a JSON list of toxics: line 2, column 31, at the end of `\"type\":\"latency\" \"`: invalid character '\"' after object key:value pair"},
		{"a trailing comma", `[{"type":"latency"},]`, both, "not a JSON list of toxics: line 1, column 21, at the end of `[{\"type\":\"latency\"},]`: invalid character ']'"},
		{"a key unquoted, far along one line", `[{"type":"latency","attributes":{"latency":300,"jitter":10}},{"type":"latency",name:"b"}]`, both,
			"line 1, column 80, at the end of `{\"type\":\"latency\",n`: invalid character 'n' looking for beginning of object key string"},
		{"a control character before the error", "[{\"type\":\"latency\"}\x1b]", both, `line 1, column 20, at the end of "[{\"type\":\"latency\"}\x1b"`},
		{"cut short", `[{"type":"latency"}`, both, "not a JSON list of toxics: line 1, column 19, at the end of `[{\"type\":\"latency\"}`: unexpected end of JSON input"},
		{"an object, not a list", `{"type":"latency"}`, both, "not a JSON list of toxics: a JSON object; put a single toxic in a list, [{...}]"},
		{"a number, not a list", `5`, both, "not a JSON list of toxics: a JSON number"},
		{"a negative number, not a list", `-5`, both, "not a JSON list of toxics: a JSON number"},
		// YAML is what the rest of a manifest is written in: encoding/json
		// read "- name: slow" as a number and said "invalid character ' '
		// in numeric literal".
		{"a YAML list", "- name: slow\n  type: latency\n  attributes: {latency: 300}\n", both,
			`not a JSON list of toxics: it reads as a YAML list ("- ..."); write it in JSON, as Toxiproxy's: [{"name":"slow","type":"latency","attributes":{"latency":300}}]`},
		{"a YAML list after a newline", "\n  -\ttype: latency", both, `it reads as a YAML list ("- ...")`},
		{"down given an attribute", `[{"type":"down","attributes":{"delay":5}}]`, both, "[0].attributes.delay: down takes no attributes"},
		{"name past 253 bytes", `[{"type":"latency","name":"` + strings.Repeat("n", 254) + `"}]`, both, "[0].name: at most 253 bytes, not 254 (a name is a metric label)"},
		{"type missing", `[{"name":"x"}]`, both, "[0].type: required"},
		{"type unknown", `[{"type":"latency"},{"type":"lag"}]`, both, `[1].type: unknown toxic type "lag"`},
		{"stream unknown", `[{"type":"latency","stream":"sideways"}]`, both, "[0].stream: must be"},
		{"toxicity above 1", `[{"type":"latency","toxicity":1.5}]`, both, "[0].toxicity: must be within [0, 1]"},
		{"toxicity negative", `[{"type":"latency","toxicity":-0.1}]`, both, "[0].toxicity: must be within [0, 1]"},
		{"toxicity not a number", `[{"type":"latency","toxicity":"high"}]`, both, "[0].toxicity: must be a JSON number, not a JSON string"},
		// Beyond float32's range: encoding/json's overflow was worded "must be
		// a JSON number, not a JSON number 1e40".
		{"toxicity beyond float32", `[{"type":"latency","toxicity":1e40}]`, both, "[0].toxicity: must be within [0, 1], not 1e40"},
		{"attribute unknown", `[{"type":"latency","attributes":{"delay":5}}]`, both, "[0].attributes.delay: not an attribute of latency (known: jitter, latency)"},
		{"attribute given twice in two cases", `[{"type":"latency","attributes":{"Latency":1,"latency":2}}]`, both, `[0].attributes.latency: given twice, as "Latency" and "latency"`},
		{"attribute negative", `[{"type":"latency","attributes":{"latency":-5}}]`, both, "[0].attributes.latency: must not be negative"},
		{"attribute not a number", `[{"type":"latency","attributes":{"latency":"300ms"}}]`, both, `[0].attributes.latency: must be a number, not "300ms"`},
		{"attributes not an object", `[{"type":"latency","attributes":[300]}]`, both, "[0].attributes: must be a JSON object, not a JSON array"},
		{"name not a string", `[{"type":"latency","name":5}]`, both, "[0].name: must be a JSON string, not a JSON number"},
		// Printed raw by /debug/connections?format=text, an ESC sequence
		// cleared the operator's terminal and a newline forged a row.
		{"name with control characters", `[{"name":"x\u001b[2J\nforged","type":"latency"}]`, both, `[0].name: must be printable, not "x\x1b[2J\nforged" (U+001B at byte 1)`},
		{"name with a bidi override", `[{"name":"x\u202egp","type":"latency"}]`, both, `[0].name: must be printable, not "x\u202egp" (U+202E at byte 1)`},
		{"clients not a list", `[{"type":"latency","clients":"10.0.0.0/8"}]`, both, "[0].clients: must be a JSON list, not a JSON string"},
		{"origin not a string", `[{"type":"latency","origin":5}]`, both, "[0].origin: must be a JSON string, not a JSON number"},
		{"seed not a number", `[{"type":"latency","seed":"x"}]`, both, "[0].seed: must be a JSON number, not a JSON string"},
		{"seed a fraction", `[{"type":"latency","seed":1.5}]`, both, "[0].seed: must be a whole number within int64's range, not 1.5"},
		{"seed too big", `[{"type":"latency","seed":1e30}]`, both, "[0].seed: must be a whole number within int64's range, not 1e30"},
		{"probability above 1", `[{"type":"loss","attributes":{"rate":50}}]`, both, "[0].attributes.rate: is a probability"},
		{"loss rate with the Gilbert-Elliott model", `[{"type":"loss","attributes":{"rate":0.5,"p":0.1}}]`, both, "[0].attributes.rate: random loss (rate) and the Gilbert-Elliott model (p > 0) exclude each other"},
		{"bandwidth rate below a byte a second", `[{"type":"bandwidth","attributes":{"rate":1e-9}}]`, both, "[0].attributes.rate: must be 0 (hold the stream) or at least 0.001"},
		{"duration past time.Duration", `[{"type":"reset_peer","attributes":{"timeout":1e13}}]`, both, "[0].attributes.timeout: must be at most 1e+12, not 1e+13"},
		{"latency past time.Duration", `[{"type":"latency","attributes":{"latency":1e16}}]`, both, "[0].attributes.latency: must be at most 1e+12"},
		{"slicer size past the bound", `[{"type":"slicer","attributes":{"average_size":1e19}}]`, both, "[0].attributes.average_size: must be at most 1e+12"},
		{"slicer size 0", `[{"type":"slicer"}]`, both, "[0].attributes.average_size: must be greater than 0"},
		// A byte count is whole, as Toxiproxy's integers: 1.5 was taken,
		// shown as 1.5 and passed 1 byte (0.5 passed none).
		{"limit_data bytes a fraction", `[{"type":"limit_data","attributes":{"bytes":1.5}}]`, both, "[0].attributes.bytes: must be a whole number of bytes, not 1.5"},
		{"slicer size a fraction", `[{"type":"slicer","attributes":{"average_size":10.5}}]`, both, "[0].attributes.average_size: must be a whole number of bytes, not 10.5"},
		{"slicer variation a fraction", `[{"type":"slicer","attributes":{"average_size":10,"size_variation":0.5}}]`, both, "[0].attributes.size_variation: must be a whole number of bytes, not 0.5"},
		{"unknown field", `[{"type":"latency","latancy":300}]`, both, "[0].latancy: unknown field (a toxic has name, type, stream, toxicity, attributes, port, clients, seed)"},
		{"name twice", `[{"type":"latency"},{"type":"latency","attributes":{"latency":1}}]`, both, `[1].name: "latency_downstream" is used twice on port "http"`},
		{"name twice on one port, once for every port", `[{"name":"slow","type":"latency"},{"name":"slow","type":"latency","port":"admin"}]`, []ServicePort{tcpHTTP, tcpAdmin}, `[1].name: "slow" is used twice on port "admin"; toxic names must be unique per port`},
		// A number, not an object: encoding/json's text named the Go type
		// it decodes into ("cannot unmarshal number into Go value of type
		// faults.plain").
		{"a toxic not an object", `[1]`, both, `[0]: a toxic must be a JSON object {"name": ..., "type": ...}, not a JSON number`},
		{"a toxic a list", `[[]]`, both, `[0]: a toxic must be a JSON object {"name": ..., "type": ...}, not a JSON array`},
		// Gilbert-Elliott attributes without p > 0 were random loss at its
		// default rate 1: every datagram lost.
		{"loss Gilbert-Elliott with p 0", `[{"type":"loss","attributes":{"p":0,"r":0.5,"loss_good":0.01}}]`, both, "[0].attributes.p: r is the Gilbert-Elliott model's, which acts only with p > 0"},
		{"loss loss_good alone", `[{"type":"loss","attributes":{"loss_good":0.01}}]`, both, "[0].attributes.p: loss_good is the Gilbert-Elliott model's"},
		{"client not a CIDR", `[{"type":"latency","clients":["10.0.0.0/8","ten"]}]`, both, `[0].clients[1]: "ten" is not a CIDR or an IP`},
		{"mapped CIDR wider than IPv4", `[{"type":"latency","clients":["::ffff:0:0/64"]}]`, both, `[0].clients[0]: "::ffff:0:0/64" is an IPv4-mapped CIDR shorter than /96`},
		{"port not on the Service, by name", `[{"type":"latency","port":"https"}]`, both, `[0].port: the Service has no port "https"`},
		{"port not on the Service, by number", `[{"type":"latency","port":443}]`, both, `[0].port: the Service has no port "443"`},
		{"port neither name nor number", `[{"type":"latency","port":[80]}]`, both, "[0].port: must be a port name or number, not [80]"},
		{"port a fraction", `[{"type":"latency","port":80.5}]`, both, "[0].port: must be a port name or number, not 80.5"},
		{"TCP-only toxic on a UDP port", `[{"type":"reset_peer","port":"dns"}]`, both, `[0].type: reset_peer acts on TCP, and port "dns" is UDP (a UDP port takes down, duplicate, latency, loss, noop, reorder)`},
		{"connect-time toxic on a UDP port", `[{"type":"refuse","port":53}]`, both, `[0].type: refuse acts on TCP, and port "53" is UDP`},
		{"UDP toxic on a TCP port", `[{"type":"loss","port":"http"}]`, both, `[0].type: loss acts on UDP, and port "http" is TCP (a TCP port takes bandwidth, connect_delay, down, latency, limit_data, noop, refuse, reset_peer, slicer, slow_close, timeout)`},
		{"UDP toxic on a TCP port, by number", `[{"type":"duplicate","port":80}]`, both, `[0].type: duplicate acts on UDP, and port "80" is TCP`},
		{"any toxic on an SCTP port", `[{"type":"latency","port":"sig"}]`, []ServicePort{tcpHTTP, {Name: "sig", Number: 3868, Protocol: "SCTP"}}, `[0].type: latency acts on TCP and UDP, and port "sig" is SCTP`},
		{"UDP toxic, no UDP port", `[{"type":"reorder"}]`, []ServicePort{tcpHTTP}, "[0].type: reorder acts on UDP, and the Service has no such port"},
		{"TCP toxic, no TCP port", `[{"type":"slow_close"}]`, []ServicePort{udpDNS}, "[0].type: slow_close acts on TCP, and the Service has no such port (a UDP port takes down, duplicate, latency, loss, noop, reorder)"},
		// What the UDP port takes, whatever the order of the ports: an SCTP
		// port listed after it, which takes nothing, hid the hint.
		{"TCP toxic, a UDP port then an SCTP one", `[{"type":"slow_close"}]`, []ServicePort{udpDNS, {Name: "sig", Number: 3868, Protocol: "SCTP"}},
			"[0].type: slow_close acts on TCP, and the Service has no such port (a UDP port takes down, duplicate, latency, loss, noop, reorder)"},
		// The protocol is checked before the attributes: a slicer without
		// its average_size on a UDP port was told of the attribute first,
		// and of the protocol only once that was fixed.
		{"TCP toxic without its attributes, no TCP port", `[{"name":"x","type":"slicer"}]`, []ServicePort{udpDNS}, "[0].type: slicer acts on TCP, and the Service has no such port"},
		{"TCP toxic without its attributes on a UDP port", `[{"type":"slicer","port":"dns"}]`, both, `[0].type: slicer acts on TCP, and port "dns" is UDP`},
		{"UDP toxic with a bad attribute on a TCP port", `[{"type":"loss","port":"http","attributes":{"rate":2}}]`, both, `[0].type: loss acts on UDP, and port "http" is TCP`},
		{"port not on the Service, bad attribute", `[{"type":"latency","port":"https","attributes":{"latency":-1}}]`, both, `[0].port: the Service has no port "https"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseAnnotation(tc.value, tc.ports)
			if err == nil {
				t.Fatalf("no error; parsed %s", summary(got))
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q, want it to contain %q", err, tc.want)
			}
		})
	}
}

// ForService reads the annotation against the Service's own ports, the
// protocol defaulting to TCP as the API server defaults it.
func TestForService(t *testing.T) {
	svc := &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web"},
		Spec: v1.ServiceSpec{Ports: []v1.ServicePort{
			{Name: "http", Port: 80},
			{Name: "dns", Port: 53, Protocol: v1.ProtocolUDP},
		}},
	}
	if got, err := ForService(svc); got != nil || err != nil {
		t.Fatalf("no annotation: got %v, %v; want nil, nil", got, err)
	}
	svc.Annotations = map[string]string{Annotation: `[{"type":"reset_peer"},{"type":"loss","attributes":{"rate":0.1}}]`}
	got, err := ForService(svc)
	if err != nil {
		t.Fatal(err)
	}
	if s := summary(got); s != "http:reset_peer_downstream/reset_peer/downstream/1 dns:loss_downstream/loss/downstream/1" {
		t.Fatalf("got %s", s)
	}
	svc.Annotations[Annotation] = `[{"type":"loss","port":"http"}]`
	if _, err := ForService(svc); err == nil || !strings.Contains(err.Error(), "[0].type") {
		t.Fatalf("loss on the TCP port: err %v, want a [0].type error", err)
	}
}

func TestProxyName(t *testing.T) {
	for _, tc := range []struct {
		ns, svc, port string
		number        int
		want          string
	}{
		{"default", "web", "http", 80, "default.web.http"},
		{"kube-system", "kube-dns", "", 53, "kube-system.kube-dns.53"},
	} {
		if got := ProxyName(tc.ns, tc.svc, tc.port, tc.number); got != tc.want {
			t.Errorf("ProxyName(%q, %q, %q, %d) = %q, want %q", tc.ns, tc.svc, tc.port, tc.number, got, tc.want)
		}
	}
}

// The annotation declares at most MaxAnnotationToxicsPerPort toxics on a
// port: each is a series of faults_injected_total per port it goes to,
// and one Service's annotation of 8,000 toxics (247 KB, which the API
// server takes) on 50 ports made 400,000 series, a 50 MB /metrics and
// half a GB more in the proxy. A refused annotation is refused at the
// toxic past the bound, without parsing the rest.
func TestParseAnnotationToxicsPerPortBounded(t *testing.T) {
	list := func(n int, extra string) string {
		var b strings.Builder
		b.WriteString("[")
		for i := range n {
			if i > 0 {
				b.WriteString(",")
			}
			b.WriteString(`{"type":"down","name":"t` + strconv.Itoa(i) + `"` + extra + `}`)
		}
		b.WriteString("]")
		return b.String()
	}
	ports := make([]ServicePort, 50)
	for i := range ports {
		ports[i] = ServicePort{Name: "p" + strconv.Itoa(i), Number: int32(1000 + i), Protocol: "TCP"}
	}
	const most = MaxAnnotationToxicsPerPort
	if got, err := ParseAnnotation(list(most, ""), ports); err != nil || len(got["p49"]) != most {
		t.Fatalf("%d toxics on each port: %d on p49, %v", most, len(got["p49"]), err)
	}
	want := fmt.Sprintf(`[%d]: port "p0" would have %d toxics; the annotation declares at most %d per port`, most, most+1, most)
	if _, err := ParseAnnotation(list(most+1, ""), ports); err == nil || err.Error() != want {
		t.Errorf("%d toxics on every port: %v, want %q", most+1, err, want)
	}
	// Counted per port: as many again on another port are not too many.
	both := list(most, `,"port":"p1"`)
	both = both[:len(both)-1] + "," + strings.ReplaceAll(list(most, `,"port":"p2"`)[1:], `"name":"t`, `"name":"u`)
	if got, err := ParseAnnotation(both, ports); err != nil || len(got["p1"]) != most || len(got["p2"]) != most {
		t.Errorf("%d toxics on p1 and %d on p2: %d and %d, %v", most, most, len(got["p1"]), len(got["p2"]), err)
	}
	// Refused at the toxic past the bound, the rest not parsed: an error
	// of the last toxic would be told if it were. (Timed against 2 s, it
	// took 2.9 s under -race on a loaded machine.)
	many := list(8000, "")
	many = many[:len(many)-1] + `,{"type":"no-such-type"}]`
	if _, err := ParseAnnotation(many, ports); err == nil || err.Error() != want {
		t.Errorf("8,000 toxics on every one of 50 ports: %v, want %q", err, want)
	}
	// A name given twice on a port is still refused (the names are a set
	// per port: walking the port's toxics for each made the parse
	// quadratic).
	dup := list(most, "")
	dup = dup[:len(dup)-1] + `,{"type":"down","name":"t42","port":"p3"}]`
	if _, err := ParseAnnotation(dup, ports); err == nil || !strings.Contains(err.Error(), `"t42" is used twice on port "p3"`) {
		t.Errorf("a name given twice: %v, want it refused", err)
	}
}

// An invalid value is quoted by a bounded prefix and its length, not
// whole: the annotation takes 256 KiB from the API server, and its error
// goes to the log and /debug/services (and the fault API's answer).
func TestParseAnnotationErrorsQuoteBoundedValues(t *testing.T) {
	big := strings.Repeat("5", 300000)
	both := []ServicePort{tcpHTTP, udpDNS}
	for _, tc := range []struct {
		name, value string
	}{
		{"type", `[{"type":"` + big + `"}]`},
		{"stream", `[{"type":"latency","stream":"` + big + `"}]`},
		{"unprintable name", `[{"type":"latency","name":"\n` + big + `"}]`},
		{"port name", `[{"type":"latency","port":"` + big + `"}]`},
		{"port not a name or number", `[{"type":"latency","port":[` + big + `]}]`},
		{"attribute name", `[{"type":"latency","attributes":{"` + big + `":1}}]`},
		{"attribute not a number", `[{"type":"latency","attributes":{"latency":"` + big + `"}}]`},
		{"attribute given twice", `[{"type":"latency","attributes":{"Latency":1,"latency` + big + `":2}}]`},
		{"unknown field", `[{"type":"latency","` + big + `":1}]`},
		{"seed out of range", `[{"type":"latency","seed":` + big + `}]`},
		{"client", `[{"type":"latency","clients":["` + big + `"]}]`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseAnnotation(tc.value, both)
			if err == nil {
				t.Fatal("parsed")
			}
			if msg := err.Error(); len(msg) > 1000 || !strings.Contains(msg, " bytes)") {
				t.Errorf("error of %d bytes, want at most 1000 naming the value's length: %.300s", len(msg), msg)
			}
		})
	}
}

// A negative zero is zero: "toxicity":-0 and "timeout":-0.0 were kept and
// listed back (API, /debug/services) as -0.
func TestNegativeZeroReadsAsZero(t *testing.T) {
	byPort, err := ParseAnnotation(`[{"name":"cut","type":"reset_peer","toxicity":-0,"attributes":{"timeout":-0.0}}]`,
		[]ServicePort{{Name: "http", Number: 80, Protocol: "TCP"}})
	if err != nil {
		t.Fatal(err)
	}
	out, err := json.Marshal(byPort["http"][0])
	if err != nil {
		t.Fatal(err)
	}
	if s := string(out); strings.Contains(s, "-0") {
		t.Errorf("toxic reads %s, want 0 where -0 was given", s)
	}
}
