// Package clip bounds the values users gave that messages quote. An
// invalid value is quoted back in its error, and errors go to the log,
// /debug/services and the fault API's answers: a 300 KB annotation value
// (the API server takes 256 KiB of annotations) or manifest line was
// copied whole into each. A value longer than Max is quoted by its first
// Max bytes and its length:
//
//	"5555555555"... (300000 bytes)
package clip

import (
	"fmt"
	"reflect"
	"regexp"
	"strconv"
	"unicode/utf8"
)

// Max is the most of a value a message quotes, in bytes.
const Max = 200

// Quote is strconv.Quote(s), of s's first Max bytes when it is longer,
// followed by its length.
func Quote(s string) string {
	if len(s) <= Max {
		return strconv.Quote(s)
	}
	return strconv.Quote(prefix(s)) + suffix(len(s))
}

// String is s, or its first Max bytes followed by its length.
func String(s string) string {
	if len(s) <= Max {
		return s
	}
	return prefix(s) + suffix(len(s))
}

// Value is a string argument of fmt's functions that prints as Quote
// with %q, and as String with any other verb.
type Value string

func (v Value) Format(f fmt.State, verb rune) {
	if verb == 'q' {
		_, _ = f.Write([]byte(Quote(string(v))))
		return
	}
	_, _ = f.Write([]byte(String(string(v))))
}

// Args wraps the string arguments of a format longer than Max in Value, so
// that a message built from them quotes a bounded prefix of each.
func Args(args []any) []any {
	for i, a := range args {
		if s, ok := stringOf(a); ok && len(s) > Max {
			args[i] = Value(s)
		}
	}
	return args
}

// quoted is a double-quoted Go or JSON string in a message.
var quoted = regexp.MustCompile(`"(?:[^"\\]|\\.)*"`)

// Quoted shortens each quoted string longer than Max in msg, a message
// from a library (a decoder's "unknown field", "parsing time", "key ...
// already set in map") that quotes what it was given whole.
func Quoted(msg string) string {
	if len(msg) <= Max {
		return msg
	}
	return quoted.ReplaceAllStringFunc(msg, func(q string) string {
		if len(q) <= Max+2 {
			return q
		}
		if s, err := strconv.Unquote(q); err == nil {
			return Quote(s)
		}
		// JSON escapes Go does not read (\/): cut the quoted text itself.
		return prefix(q) + `"` + suffix(len(q)-2)
	})
}

func stringOf(a any) (string, bool) {
	switch v := a.(type) {
	case string:
		return v, true
	case fmt.Stringer, error:
		return "", false
	}
	// Named string types (v1.Protocol, v1.ServiceType...).
	if rv := reflect.ValueOf(a); rv.Kind() == reflect.String {
		return rv.String(), true
	}
	return "", false
}

func prefix(s string) string {
	n := Max
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

func suffix(n int) string { return fmt.Sprintf("... (%d bytes)", n) }
