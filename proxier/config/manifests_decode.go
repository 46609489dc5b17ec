package config

//lint:file-ignore SA1019 v1.Endpoints is read on purpose: manifests may hold them, and they are converted to EndpointSlices

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/klog/v2"
	sigsjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"

	yamlv3 "go.yaml.in/yaml/v3"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/internal/suggest"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/internal/clip"
)

// The kinds the manifests source understands.
const (
	KindService       = "Service"
	KindEndpointSlice = "EndpointSlice"
	KindEndpoints     = "Endpoints"
)

// apiVersions says which apiVersion each understood kind must carry.
var apiVersions = map[string]string{
	KindService:       "v1",
	KindEndpointSlice: "discovery.k8s.io/v1",
	KindEndpoints:     "v1",
}

// Manifest is one valid, defaulted object decoded from a manifest file.
// Object is a *v1.Service, a *discovery.EndpointSlice or a *v1.Endpoints.
type Manifest struct {
	File      string
	Doc, Line int
	Kind      string
	Namespace string
	Name      string
	Object    runtime.Object
}

// DecodeManifests decodes every document of one manifest file (multi-document
// YAML separated by "---", or one or several JSON objects one after another;
// v1 List objects are unpacked). name is
// only used in messages. Decoding is strict: unknown or duplicate fields are
// errors. Valid objects come back defaulted as the API server would default
// them; each invalid or unreadable document yields one *ManifestError and is
// left out. Documents of other kinds are skipped with a V(2) note, unless
// they look like a misspelt kind the proxy reads (see unreadKind).
func DecodeManifests(name string, data []byte) ([]Manifest, []error) {
	return decoder{nodePorts: DefaultNodePortRange}.decode(name, data)
}

// decoder carries the settings validation depends on.
type decoder struct {
	nodePorts PortRange
}

func (d decoder) decode(name string, data []byte) ([]Manifest, []error) {
	out, errs, _, _ := d.decodeKnown(name, data, nil)
	return out, errs
}

// docDigest identifies a document by its bytes.
type docDigest [sha256.Size]byte

// decodeKnown is decode that takes each document it finds in known (the
// documents of the file's last version that decoded without error) from
// there rather than decoding it again, and returns this version's such
// documents. An edit of one document of a file of 20,000 decoded all of
// them again, a second or two before the change went live. otherKinds is
// the kind of each object skipped as one the proxy does not use, for the
// summary.
func (d decoder) decodeKnown(name string, data []byte, known map[docDigest][]Manifest) (out []Manifest, errs []error, good map[docDigest][]Manifest, otherKinds []string) {
	docs, streamErr := splitDocuments(data)
	good = make(map[docDigest][]Manifest, len(docs))
	for i, doc := range docs {
		loc := docLocation{file: name, doc: i + 1, line: doc.line}
		sum := docDigest(sha256.Sum256(doc.body))
		ms, ok := known[sum]
		if ok {
			ms = slices.Clone(ms)
			for j := range ms {
				ms[j].Doc, ms[j].Line = loc.doc, loc.line // it may have moved
			}
		} else if n, over := tooManyValues(doc.body); over {
			// Not identified: the file keeps its previous objects.
			errs = append(errs, loc.err(fmt.Errorf("holds more than %d values (counted as its commas, colons, newlines, [ and {), "+
				"the most a document may hold, as decoding takes a few hundred bytes per value: split it into several documents or files", n-1)))
		} else {
			var es []error
			ms, es = d.decodeDocument(loc, doc.body, listItem{})
			errs = append(errs, es...)
			ok = len(es) == 0
		}
		if ok {
			good[sum] = ms
		}
		for _, m := range ms {
			if m.Object == nil {
				otherKinds = append(otherKinds, m.Kind)
			} else {
				out = append(out, m)
			}
		}
	}
	if streamErr != nil {
		// Not identified: the file keeps its previous objects.
		errs = append(errs, &ManifestError{File: name, Doc: len(docs) + 1, Err: streamErr})
	}
	return out, errs, good, otherKinds
}

// maxDocumentValues bounds the values (scalars, lists, maps) one document
// may hold, estimated before it is decoded (tooManyValues). The file's
// 64 MiB bound is on the bytes read, not on what they decode into: the YAML
// decoder holds a node per value, a few hundred bytes, and a value can be
// two bytes (`1,`), so an 8 MiB document of them took 852 MB, and a 64 MiB
// one more than 4 GB (the proxy's OOM). A kubectl List of 10,000 Services
// and their EndpointSlices (13 MB of YAML) counts 1.45 million and took
// 584 MB; this bound takes Lists of about 25,000 of each and holds a
// document to about 1.6 GB. An alias bomb and deep nesting are the YAML
// decoder's to refuse (excessive aliasing, max depth).
var maxDocumentValues = 4_000_000

// valueEnds marks the bytes that tooManyValues counts: each value of a
// document is followed by a newline or a comma, or opens with [ or {, or
// is a key before a colon; so their count is at least the values'.
var valueEnds = func() (t [256]bool) {
	for _, c := range []byte(",:\n[{") {
		t[c] = true
	}
	return t
}()

// tooManyValues counts body's valueEnds up to one past maxDocumentValues,
// and reports whether that is past it.
func tooManyValues(body []byte) (int, bool) {
	n := 0
	for _, c := range body {
		if valueEnds[c] {
			if n++; n > maxDocumentValues {
				return n, true
			}
		}
	}
	return n, false
}

type docLocation struct {
	file      string
	doc, line int
	item      string // "items[i]" for an item of a List document
}

func (l docLocation) err(err error) *ManifestError {
	return &ManifestError{File: l.file, Doc: l.doc, Line: l.line, Item: l.item, Err: err}
}

// typeAndName is read leniently first, so that even an object that fails
// strict decoding can be named in its error and keep its last good version.
type typeAndName struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name      string `json:"name"`
		Namespace string `json:"namespace"`
	} `json:"metadata"`
}

// listItem says which list a document is an item of, and where; the zero
// value is a document of the file itself.
type listItem struct {
	list  string // the list's kind: List, ServiceList...
	index int
}

// decodeDocument decodes one YAML or JSON document. Items of a typed list
// (ServiceList...) may omit their kind: they take the list's item kind.
func (d decoder) decodeDocument(loc docLocation, body []byte, in listItem) ([]Manifest, []error) {
	defaultKind := strings.TrimSuffix(in.list, "List")
	var tn typeAndName
	// One YAML parse serves both reads when it can: the document turned
	// into JSON strictly, the type and name read from that JSON, and the
	// object decoded from the same JSON (the YAML-to-JSON conversion was
	// 72 % of a reload's CPU, done twice: 2.3-2.6 CPU-seconds to read
	// 10,000 changed slices again). A document that does not convert
	// strictly (a duplicate key), or whose type and name need the YAML
	// decoder's reading of scalars by target type (a name written as a
	// number), takes the two passes as before, so its error is the same.
	j, jerr := yaml.YAMLToJSONStrict(body)
	if jerr != nil || json.Unmarshal(j, &tn) != nil {
		j, tn = nil, typeAndName{}
		if err := yaml.Unmarshal(body, &tn); err != nil {
			return nil, []error{loc.err(atFileLine(err, loc.line))}
		}
	}
	if tn.Kind == "" {
		tn.Kind = defaultKind
	}
	if tn.Kind == "" {
		return nil, []error{loc.err(errors.New("object has no kind"))}
	}
	if strings.HasSuffix(tn.Kind, "List") {
		if in.list != "" {
			// Each level parses all it holds again: 3,000 nested Lists (81 KB)
			// took 30 s. Nor does a List of Lists mean anything to kubectl
			// or the API server.
			return nil, []error{loc.err(fmt.Errorf("a %s inside a %s is not read: put its items in the outer list",
				printable(tn.Kind), printable(in.list)))}
		}
		return d.decodeList(loc, body, j, tn.Kind)
	}
	want, known := apiVersions[tn.Kind]
	if !known {
		if err := unreadKind(tn.APIVersion, tn.Kind, defaultKind != ""); err != nil {
			// Not identified: a misspelt Service keeps its last good version.
			if tn.Metadata.Name != "" {
				err = fmt.Errorf("%w (metadata.name %s)", err, printable(tn.Metadata.Name))
			}
			return nil, []error{loc.err(err)}
		}
		klog.V(2).InfoS("manifests: skipping object of a kind the proxy does not use",
			"file", loc.file, "doc", loc.doc, "apiVersion", tn.APIVersion, "kind", tn.Kind, "name", tn.Metadata.Name)
		// Without an Object: decodeKnown counts it for the summary (a
		// Deployment beside the Services was said at -v=2 only) and
		// hands it to no one.
		return []Manifest{{File: loc.file, Doc: loc.doc, Line: loc.line, Kind: printable(tn.Kind)}}, nil
	}
	ns := tn.Metadata.Namespace
	if ns == "" {
		ns = v1.NamespaceDefault
	}
	merr := &ManifestError{File: loc.file, Doc: loc.doc, Line: loc.line, Kind: tn.Kind, Namespace: ns, Name: tn.Metadata.Name}
	if merr.Name == "" {
		merr.Err = errors.New("metadata.name is required")
		return nil, []error{merr}
	}
	if tn.APIVersion != want && !(defaultKind != "" && tn.APIVersion == "") {
		merr.Err = fmt.Errorf("apiVersion %s is not supported for %s, use %q", clip.Quote(tn.APIVersion), tn.Kind, want)
		return nil, []error{merr}
	}
	obj, unknown, err := decodeStrict(tn.Kind, body, j)
	if err != nil {
		err = atFileLine(err, loc.line)
	} else {
		// An unknown or duplicate field leaves the rest of the object
		// decoded: it is validated too, so that one report names all of
		// the object's errors (a misspelt field hid a port out of range
		// until it was fixed and the file saved again).
		setDefaults(obj)
		err = joinErrors(unknown, validate(obj, d.nodePorts))
	}
	if err != nil {
		merr.Err = err
		return nil, []error{merr}
	}
	return []Manifest{{File: loc.file, Doc: loc.doc, Line: loc.line, Kind: tn.Kind, Namespace: ns, Name: tn.Metadata.Name, Object: obj}}, nil
}

// decodeStrict decodes body into the typed object for kind, rejecting unknown
// and duplicate fields (sigs.k8s.io/yaml turns YAML into JSON, rejecting
// duplicate keys; sigs.k8s.io/json decodes it strictly). j is body already
// turned into JSON strictly, or nil. unknown names every unknown or
// duplicate field of an object that otherwise decoded (obj is that
// object); err is a document that did not decode (a value of the wrong
// type: the decoder stops at the first, and says nothing of the fields).
func decodeStrict(kind string, body, j []byte) (obj runtime.Object, unknown, err error) {
	switch kind {
	case KindService:
		obj = &v1.Service{}
	case KindEndpointSlice:
		obj = &discovery.EndpointSlice{}
	case KindEndpoints:
		obj = &v1.Endpoints{}
	default:
		return nil, nil, fmt.Errorf("kind %q is not supported", kind)
	}
	if j == nil {
		if j, err = yaml.YAMLToJSONStrict(body); err != nil {
			return nil, nil, err
		}
	}
	// sigs.k8s.io/json is the API server's strict decoder: field names are
	// case-sensitive and every unknown or duplicate field is reported with
	// its path.
	strictErrs, err := sigsjson.UnmarshalStrict(j, obj)
	if err != nil {
		if fe := typeMismatch(obj, j, err); fe != nil {
			return nil, nil, fe
		}
		return nil, nil, cleanDecodeError(err)
	}
	if len(strictErrs) > 0 {
		msgs := make([]string, len(strictErrs))
		for i, e := range strictErrs {
			msgs[i] = cleanDecodeError(e).Error()
		}
		unknown = errors.New(strings.Join(msgs, "; "))
	}
	return obj, unknown, nil
}

// joinErrors is a and b in one line, or the one that is not nil.
func joinErrors(a, b error) error {
	switch {
	case a == nil:
		return b
	case b == nil:
		return a
	}
	return fmt.Errorf("%v; %v", a, b)
}

// yamlLine is the YAML parser's line number, counted from its document's
// first line.
var yamlLine = regexp.MustCompile(`^(?:error converting YAML to JSON: )?yaml: line (\d+): `)

// atFileLine restates a YAML parser error's line as the file's: "document
// 3 (line 38): yaml: line 10: ..." left the reader to work out line 47.
func atFileLine(err error, docLine int) error {
	m := yamlLine.FindStringSubmatchIndex(err.Error())
	if m == nil || docLine <= 0 {
		return err
	}
	msg := err.Error()
	n, convErr := strconv.Atoi(msg[m[2]:m[3]])
	if convErr != nil {
		return err
	}
	return fmt.Errorf("line %d: %s", docLine+n-1, msg[m[1]:])
}

// unmarshalTypeErr is what sigs.k8s.io/json says of a value of the wrong
// JSON type (its error type is internal, so the message is all there is).
var unmarshalTypeErr = regexp.MustCompile(`cannot unmarshal (\w+) into Go struct field \S*?\.((?:\w+\.)*\w+) of type (\S+)`)

// typeMismatch turns sigs.k8s.io/json's "cannot unmarshal string into Go
// struct field ServicePort.spec.ports.port of type int32" into the field
// path and value a person wrote: spec.ports[0].port: must be a number, not
// the string "80". nil when err is not such an error.
func typeMismatch(obj any, j []byte, err error) *fieldError {
	m := unmarshalTypeErr.FindStringSubmatch(err.Error())
	if m == nil {
		return nil
	}
	got, path := m[1], strings.Split(m[2], ".")
	want := "of another type (" + m[3] + ")"
	if t, ok := suggest.FieldType(reflect.TypeOf(obj), path); ok {
		// The error names the type of the value that failed: the field's,
		// or a list item's or map value's type (annotations: string).
		for t.String() != m[3] && (t.Kind() == reflect.Slice || t.Kind() == reflect.Array || t.Kind() == reflect.Map || t.Kind() == reflect.Pointer) {
			t = t.Elem()
		}
		switch t.Kind() {
		case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
			reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
			want = "a whole number"
		case reflect.Float32, reflect.Float64:
			want = "a number"
		case reflect.Bool:
			want = "true or false"
		case reflect.String:
			want = "a string"
		case reflect.Slice, reflect.Array:
			want = "a list"
		case reflect.Struct, reflect.Map:
			want = "an object"
		}
	}
	var doc any
	if json.Unmarshal(j, &doc) == nil {
		if where, value, ok := findOfKind(doc, path, got, ""); ok {
			v, _ := json.Marshal(value)
			return &fieldError{Path: where, Msg: fmt.Sprintf("must be %s, not the %s %s", want, jsonNoun(got), clip.String(string(v)))}
		}
	}
	return &fieldError{Path: m[2], Msg: fmt.Sprintf("must be %s, not %s", want, withArticle(jsonNoun(got)))}
}

// jsonNoun is how a JSON kind of encoding/json's errors reads to a person
// editing YAML.
func jsonNoun(kind string) string {
	switch kind {
	case "array":
		return "list"
	case "bool":
		return "boolean"
	}
	return kind
}

func withArticle(noun string) string {
	if strings.ContainsRune("aeiou", rune(noun[0])) {
		return "an " + noun
	}
	return "a " + noun
}

// findOfKind walks path through v (lists are walked item by item) to the
// first value whose JSON kind is kind, and returns its path with list
// indexes.
func findOfKind(v any, path []string, kind, at string) (string, any, bool) {
	if len(path) == 0 && jsonKind(v) == kind {
		return at, v, true
	}
	switch v := v.(type) {
	case []any:
		for i, item := range v {
			if where, val, ok := findOfKind(item, path, kind, fmt.Sprintf("%s[%d]", at, i)); ok {
				return where, val, true
			}
		}
		return "", nil, false
	case map[string]any:
		if len(path) == 0 {
			// A map's value (an annotation, a label, a selector).
			for _, k := range slices.Sorted(maps.Keys(v)) {
				if jsonKind(v[k]) == kind {
					return fmt.Sprintf("%s[%s]", at, strconv.Quote(k)), v[k], true
				}
			}
			return "", nil, false
		}
		next := path[0]
		if at != "" {
			next = at + "." + path[0]
		}
		child, ok := v[path[0]]
		if !ok {
			return "", nil, false
		}
		return findOfKind(child, path[1:], kind, next)
	}
	return "", nil, false
}

// jsonKind names v's JSON kind as encoding/json's errors do.
func jsonKind(v any) string {
	switch v.(type) {
	case string:
		return "string"
	case float64:
		return "number"
	case bool:
		return "bool"
	case []any:
		return "array"
	case map[string]any:
		return "object"
	}
	return "null"
}

// cleanDecodeError drops the wrapper prefixes sigs.k8s.io/yaml adds, which say
// nothing to a person editing a manifest.
func cleanDecodeError(err error) error {
	msg := err.Error()
	for _, p := range []string{"error unmarshaling JSON: ", "while decoding JSON: ", "json: "} {
		msg = strings.TrimPrefix(msg, p)
	}
	return errors.New(msg)
}

// decodeList unpacks a v1 List (or a typed list such as ServiceList) and
// decodes each item as if it were its own document. Items of a plain List
// must name their own kind.
func (d decoder) decodeList(loc docLocation, body, j []byte, kind string) ([]Manifest, []error) {
	var list struct {
		Items []json.RawMessage `json:"items"`
	}
	// j, the document already turned into JSON (nil if not), spares a
	// second YAML parse of the whole List; one it does not decode into
	// takes the YAML decoder, whose error is the one users saw.
	if j == nil || json.Unmarshal(j, &list) != nil {
		list.Items = nil
		if err := yaml.Unmarshal(body, &list); err != nil {
			return nil, []error{loc.err(err)}
		}
	}
	var out []Manifest
	var errs []error
	var lines []int // where each item starts, found at the first error
	for i, item := range list.Items {
		at := loc
		at.item = fmt.Sprintf("items[%d]", i)
		ms, es := d.decodeDocument(at, item, listItem{list: kind, index: i})
		if len(es) > 0 && lines == nil {
			lines = itemLines(body, loc.line)
		}
		for _, e := range es {
			if merr, ok := e.(*ManifestError); ok && i < len(lines) {
				merr.ItemLine = lines[i]
			}
		}
		out = append(out, ms...)
		errs = append(errs, es...)
	}
	return out, errs
}

// itemLines is the file line where each item of a List document starts
// (docLine: where the document does). The items were turned into JSON to be
// decoded, which keeps no lines, so the document is parsed again for them:
// only when an item has an error, to point at it. Empty when the parser
// cannot say.
func itemLines(body []byte, docLine int) []int {
	var doc yamlv3.Node
	if docLine <= 0 || yamlv3.Unmarshal(body, &doc) != nil || len(doc.Content) == 0 {
		return []int{}
	}
	top := doc.Content[0]
	if top.Kind != yamlv3.MappingNode {
		return []int{}
	}
	for i := 0; i+1 < len(top.Content); i += 2 {
		if top.Content[i].Value != "items" || top.Content[i+1].Kind != yamlv3.SequenceNode {
			continue
		}
		items := top.Content[i+1].Content
		lines := make([]int, len(items))
		for j, item := range items {
			lines[j] = docLine + item.Line - 1
		}
		return lines
	}
	return []int{}
}

// document is one object of a manifest file's stream: a YAML document or
// one JSON value.
type document struct {
	line int // 1-based line where the document starts; 0 when unknown
	body []byte
}

// readBufferSize is how much of a file the stream decoder looks at to tell
// JSON from YAML, and its initial buffer.
const readBufferSize = 4096

// splitDocuments splits a manifest file with apimachinery's stream readers,
// as kubectl does: a file that starts with "{" is a stream of JSON values
// (one or several, one after another); anything else is YAML documents
// separated by "---" lines. Documents that hold only blanks and comments
// are dropped. A stream error (a JSON value cut short, "---" followed by
// text) ends the stream; the documents before it are returned with it.
func splitDocuments(data []byte) ([]document, error) {
	var docs []document
	cursor, lines := 0, 0 // lines: how many end before cursor
	add := func(body []byte) {
		line := 0
		if i := bytes.Index(data[cursor:], body); i >= 0 {
			// Counted from the cursor, not from the file's start: a file
			// of 20,000 documents spent 0.6 s counting its lines again
			// for each one.
			lines += bytes.Count(data[cursor:cursor+i], []byte("\n"))
			line = 1 + lines
			lines += bytes.Count(body, []byte("\n"))
			cursor += i + len(body)
		}
		if !blank(body) {
			docs = append(docs, document{line: line, body: body})
		}
	}
	if utilyaml.IsJSONBuffer(data) {
		dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), readBufferSize)
		for {
			var raw json.RawMessage
			err := dec.Decode(&raw)
			if errors.Is(err, io.EOF) {
				return docs, nil
			}
			if err != nil {
				return docs, err
			}
			add(raw)
		}
	}
	r := utilyaml.NewYAMLReader(bufio.NewReaderSize(bytes.NewReader(data), readBufferSize))
	for {
		body, err := r.Read()
		if errors.Is(err, io.EOF) {
			return docs, nil
		}
		if err != nil {
			return docs, err
		}
		add(body)
	}
}

// blank reports whether a document holds nothing but whitespace, comments
// and separators (YAMLReader keeps a file's leading "---" in the first
// document).
func blank(body []byte) bool {
	for _, l := range bytes.Split(body, []byte("\n")) {
		l = bytes.TrimSpace(bytes.TrimPrefix(l, []byte("---")))
		if len(l) > 0 && l[0] != '#' {
			return false
		}
	}
	return true
}
