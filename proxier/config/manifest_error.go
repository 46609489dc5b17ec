package config

import (
	"fmt"
	"strconv"
	"strings"
	"unicode"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/internal/clip"
)

// ManifestError is one problem found in a manifest file. It renders as a
// single line naming the file and, when it could be read, the object:
//
//	svc.yaml: Service default/web: spec.ports[0].port: 70000 is out of range 1-65535
//	svc.yaml: document 2 (line 14): yaml: line 3: mapping values are not allowed in this context
//	list.yaml: document 1 (line 1), items[1] (line 9): kind "Servce" is not one the proxy reads: did you mean "Service"?
type ManifestError struct {
	File string
	// Doc is the 1-based document number inside File; Line is where it starts.
	Doc, Line int
	// Item is "items[i]" when the document is a List and the error is its
	// item's; ItemLine is where that item starts (0: not known).
	Item     string
	ItemLine int
	// Kind, Namespace and Name identify the object when the document got far
	// enough to say what it is. An identified object that is invalid keeps its
	// last good version; an unidentified document makes the whole file keep
	// its previous objects.
	Kind, Namespace, Name string
	Err                   error
}

func (e *ManifestError) Error() string {
	var b strings.Builder
	b.WriteString(e.File)
	b.WriteString(": ")
	if e.Identified() {
		fmt.Fprintf(&b, "%s %s/%s: ", printable(e.Kind), printable(e.Namespace), printable(e.Name))
	} else {
		if e.Doc > 0 && e.Line > 0 {
			fmt.Fprintf(&b, "document %d (line %d)", e.Doc, e.Line)
		} else if e.Doc > 0 {
			fmt.Fprintf(&b, "document %d", e.Doc)
		}
		if e.Item != "" && e.Doc > 0 {
			b.WriteString(", ")
		}
		if e.Item != "" && e.ItemLine > 0 {
			fmt.Fprintf(&b, "%s (line %d)", e.Item, e.ItemLine)
		} else if e.Item != "" {
			b.WriteString(e.Item)
		}
		if e.Doc > 0 || e.Item != "" {
			b.WriteString(": ")
		}
	}
	// The decoders' messages quote what they were given whole ("unknown
	// field", "parsing time", "key ... already set in map"): see clip.
	b.WriteString(oneLine(clip.Quoted(e.Err.Error())))
	return b.String()
}

func (e *ManifestError) Unwrap() error { return e.Err }

// Identified reports whether the error names the object it is about.
func (e *ManifestError) Identified() bool { return e.Kind != "" && e.Name != "" }

// fieldError is one validation failure: a field path and what is wrong with it.
type fieldError struct {
	Path string
	Msg  string
	// strict marks what only the API server's strict IP validation (on by
	// default since Kubernetes 1.36) refuses: an older API server, or an
	// object created before, still gives it (see validStateObject).
	strict bool
}

func (e *fieldError) Error() string {
	if e.Path == "" {
		return e.Msg
	}
	return e.Path + ": " + e.Msg
}

// oneLine keeps every report on a single stderr line.
func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}

// printable returns s as it is when it is a plain word, and quoted otherwise:
// an object's kind and name come from the file before validation, so a name
// holding a newline or a space would otherwise split or blur the report.
// A long one is quoted by a bounded prefix (clip.Quote).
func printable(s string) string {
	if len(s) > clip.Max {
		return clip.Quote(s)
	}
	for _, r := range s {
		if unicode.IsSpace(r) || !unicode.IsPrint(r) || r == '"' {
			return strconv.Quote(s)
		}
	}
	return s
}
