package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"

	sigsjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/internal/suggest"
)

// decodeConfigFile reads a --config file strictly (unknown and duplicate
// fields are errors) and checks its apiVersion and kind. Every error starts
// with where the problem is: "line N" for YAML syntax, the field path
// ("iptables.syncPeriod") for a bad value, "apiVersion/kind" or "document"
// otherwise, since the decoders' own messages often do not say (a bad
// duration read "time: invalid duration \"abc\"").
func decodeConfigFile(data []byte) (*configFile, error) {
	// The YAML decoder reads the first document only: a second one (a
	// Service pasted below, a second configuration) was ignored without a
	// word. kube-proxy reads one KubeProxyConfiguration too.
	if line := secondDocument(data); line > 0 {
		return nil, fmt.Errorf("document: expected one KubeProxyConfiguration, but a second document starts at line %d", line)
	}
	j, err := yaml.YAMLToJSONStrict(data)
	if err != nil {
		return nil, yamlError(err)
	}
	if t := jsonKind(j); t != "object" && t != "null" {
		return nil, fmt.Errorf("document: want a KubeProxyConfiguration object, got a %s", t)
	}
	var cfg configFile
	strict, err := sigsjson.UnmarshalStrict(j, &cfg)
	if err != nil {
		return nil, fieldError(j, err)
	}
	if len(strict) > 0 {
		msgs := make([]string, len(strict))
		for i, e := range strict {
			msgs[i] = withFieldSuggestion(cleanJSONError(e))
		}
		return nil, errors.New(strings.Join(msgs, "; "))
	}
	if cfg.APIVersion != configAPIVersion || cfg.Kind != "KubeProxyConfiguration" {
		return nil, fmt.Errorf("apiVersion/kind: want %s, KubeProxyConfiguration; got %q, %q", configAPIVersion, cfg.APIVersion, cfg.Kind)
	}
	return &cfg, nil
}

// secondDocument returns the line where a second YAML document with content
// starts, or 0 when the file holds at most one. Documents are separated as
// apimachinery's YAMLReader does: a line starting with "---" followed by
// nothing or a comment; a document of blanks and comments does not count.
func secondDocument(data []byte) int {
	docs, content := 0, false
	for i, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, "---"); ok {
			if rest = strings.TrimSpace(rest); rest == "" || rest[0] == '#' {
				content = false
				continue
			}
		}
		if t := strings.TrimSpace(line); t == "" || t[0] == '#' || content {
			continue
		}
		content = true
		if docs++; docs == 2 {
			return i + 1
		}
	}
	return 0
}

var yamlLine = regexp.MustCompile(`(?:^|: )(line \d+: .*)$`)

// yamlError says where a YAML syntax error is: its line when the parser
// knows it, the document otherwise.
func yamlError(err error) error {
	msg := oneLine(strings.TrimPrefix(err.Error(), "error converting YAML to JSON: "))
	if m := yamlLine.FindStringSubmatch(msg); m != nil {
		return errors.New(m[1])
	}
	return fmt.Errorf("document: not valid YAML: %s", strings.TrimPrefix(msg, "yaml: "))
}

// fieldError names the field whose value failed to decode: the decoders say
// it for a type mismatch but not for a value a type's own UnmarshalJSON
// refused, so the field is found by decoding each field alone.
func fieldError(j []byte, err error) error {
	msg := cleanJSONError(err.Error())
	path := badFieldPath(j, nil)
	if path == nil {
		return fmt.Errorf("document: %s", msg)
	}
	// A duration is a string with a unit; given a number (YAML's 30) the
	// decoder said "cannot unmarshal number into a value of type string",
	// which does not say so.
	if v := valueAt(j, path); v != nil && jsonKind(v) != "string" && isDuration(path) {
		return fmt.Errorf("%s: must be a duration with a unit, such as \"30s\" or \"1m\", not %s", fieldPath(path), oneLine(string(v)))
	}
	return fmt.Errorf("%s: %s", fieldPath(path), msg)
}

// isDuration reports whether the field at path is a duration: it takes
// "1s" and refuses a string that is not one.
func isDuration(path []string) bool {
	return decodesAlone(path, json.RawMessage(`"1s"`)) && !decodesAlone(path, json.RawMessage(`"x"`))
}

// valueAt is the JSON value at path in the object j, or nil.
func valueAt(j []byte, path []string) json.RawMessage {
	v := json.RawMessage(j)
	for _, k := range path {
		var obj map[string]json.RawMessage
		if json.Unmarshal(v, &obj) != nil {
			return nil
		}
		if v = obj[k]; v == nil {
			return nil
		}
	}
	return v
}

// goField is how encoding/json names the Go field of a type mismatch; the
// path in front of it says it better.
var goField = regexp.MustCompile(`into Go (?:struct field \S+|value) of type `)

func cleanJSONError(e any) string {
	msg := fmt.Sprint(e)
	for _, p := range []string{"error unmarshaling JSON: ", "while decoding JSON: ", "json: "} {
		msg = strings.TrimPrefix(msg, p)
	}
	return oneLine(goField.ReplaceAllString(msg, "into a value of type "))
}

// unknownField is sigs.k8s.io/json's strict error for a field the type
// does not have, with its dotted path ("iptables.syncPerod").
var unknownField = regexp.MustCompile(`^unknown field "([^"]+)"$`)

// withFieldSuggestion adds the field a misspelt one probably meant, among
// those of the same object: unknown field "bindAdress": did you mean
// "bindAddress"?
func withFieldSuggestion(msg string) string {
	m := unknownField.FindStringSubmatch(msg)
	if m == nil {
		return msg
	}
	parts := strings.Split(m[1], ".")
	parent := make([]string, len(parts)-1)
	for i, p := range parts[:len(parts)-1] {
		parent[i], _, _ = strings.Cut(p, "[") // a list item's fields are its element's
	}
	s := suggest.Closest(parts[len(parts)-1], suggest.JSONFields(reflect.TypeOf(configFile{}), parent))
	if s == "" {
		return msg
	}
	return fmt.Sprintf("%s: did you mean %q?", msg, strings.Join(append(parts[:len(parts)-1:len(parts)-1], s), "."))
}

// badFieldPath returns the path of the first field (in name order) of the
// JSON object j, under prefix, whose value alone does not decode into a
// configFile (fieldPath writes it dotted); nil when none fails alone.
func badFieldPath(j []byte, prefix []string) []string {
	var obj map[string]json.RawMessage
	if json.Unmarshal(j, &obj) != nil {
		return nil
	}
	keys := make([]string, 0, len(obj))
	for k := range obj {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		path := append(slices.Clone(prefix), k)
		if decodesAlone(path, obj[k]) {
			continue
		}
		// Look inside only a field that is an object itself: for a
		// scalar field given an object, the field is what is wrong, not
		// a key of the object (mode: {0: x} is "mode", not "mode.0").
		if decodesAlone(path, json.RawMessage("{}")) {
			if deeper := badFieldPath(obj[k], path); deeper != nil {
				return deeper
			}
		}
		return path
	}
	return nil
}

// fieldPath writes a field's path as the config file's readers know it,
// iptables.syncPeriod; a map key that is not a plain name (featureGates
// may hold any) is quoted, featureGates["a b"], so the path stays one
// unambiguous word before the colon.
func fieldPath(path []string) string {
	var b strings.Builder
	for i, k := range path {
		switch {
		case plainName.MatchString(k) && i == 0:
			b.WriteString(k)
		case plainName.MatchString(k):
			b.WriteString("." + k)
		default:
			b.WriteString("[" + strconv.Quote(k) + "]")
		}
	}
	return b.String()
}

var plainName = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9]*$`)

// decodesAlone reports whether {path[0]: {path[1]: ... value}} decodes into
// a configFile (unknown fields aside: those are reported by name already).
func decodesAlone(path []string, value json.RawMessage) bool {
	doc := value
	for i := len(path) - 1; i >= 0; i-- {
		b, err := json.Marshal(map[string]json.RawMessage{path[i]: doc})
		if err != nil {
			return false
		}
		doc = b
	}
	var cfg configFile
	_, err := sigsjson.UnmarshalStrict(doc, &cfg)
	return err == nil
}

// jsonKind names the kind of JSON value j holds.
func jsonKind(j []byte) string {
	j = bytes.TrimSpace(j)
	if len(j) == 0 {
		return "null"
	}
	switch j[0] {
	case '{':
		return "object"
	case '[':
		return "list"
	case '"':
		return "string"
	case 'n':
		return "null"
	case 't', 'f':
		return "boolean"
	default:
		return "number"
	}
}

// oneLine keeps an error on one line of stderr.
func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }
