// Package suggest finds the name a user probably meant: a flag, a
// configuration field or a kind misspelt by a letter or two.
package suggest

import (
	"reflect"
	"strings"
)

// Distance is the optimal string alignment distance between a and b:
// insertions, deletions, substitutions and swaps of two neighbours.
func Distance(a, b string) int {
	ra, rb := []rune(a), []rune(b)
	prev2 := make([]int, len(rb)+1)
	prev := make([]int, len(rb)+1)
	cur := make([]int, len(rb)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(ra); i++ {
		cur[0] = i
		for j := 1; j <= len(rb); j++ {
			cost := 1
			if ra[i-1] == rb[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
			if i > 1 && j > 1 && ra[i-1] == rb[j-2] && ra[i-2] == rb[j-1] {
				cur[j] = min(cur[j], prev2[j-2]+1)
			}
		}
		prev2, prev, cur = prev, cur, prev2
	}
	return prev[len(rb)]
}

// Closest is the candidate nearest to word, case aside, if it is near
// enough to be a typo: one edit for words of up to 4 letters, two beyond.
// "" when none is, or when two are equally near.
func Closest(word string, candidates []string) string {
	limit := 1
	if len([]rune(word)) > 4 {
		limit = 2
	}
	best, bestD, tie := "", limit+1, false
	for _, c := range candidates {
		d := Distance(strings.ToLower(word), strings.ToLower(c))
		switch {
		case d < bestD:
			best, bestD, tie = c, d, false
		case d == bestD && c != best:
			tie = true
		}
	}
	if tie || bestD > limit {
		return ""
	}
	return best
}

// JSONFields are the JSON names of the fields of the struct that path
// (JSON names, dot-separated parts) leads to from t, embedded structs'
// fields included; nil when path leads to no struct.
func JSONFields(t reflect.Type, path []string) []string {
	t, ok := FieldType(t, path)
	if !ok {
		return nil
	}
	if t = deref(t); t.Kind() != reflect.Struct {
		return nil
	}
	var names []string
	collect(t, &names)
	return names
}

// FieldType is the Go type of the field that path (JSON names) leads to
// from t, walking through the pointers, lists and maps on the way and
// into embedded structs; pointers to it are taken off, a list or map it
// is stays. False when the path names no field.
func FieldType(t reflect.Type, path []string) (reflect.Type, bool) {
	for _, name := range path {
		f, ok := field(deref(t), name)
		if !ok {
			return nil, false
		}
		t = f
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	return t, true
}

func deref(t reflect.Type) reflect.Type {
	for t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice || t.Kind() == reflect.Array || t.Kind() == reflect.Map {
		t = t.Elem()
	}
	return t
}

func field(t reflect.Type, name string) (reflect.Type, bool) {
	if t.Kind() != reflect.Struct {
		return nil, false
	}
	for i := range t.NumField() {
		f := t.Field(i)
		tag, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if tag == name {
			return f.Type, true
		}
		if f.Anonymous && tag == "" {
			if ft, ok := field(deref(f.Type), name); ok {
				return ft, true
			}
		}
	}
	return nil, false
}

func collect(t reflect.Type, names *[]string) {
	for i := range t.NumField() {
		f := t.Field(i)
		tag, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		switch {
		case f.Anonymous && tag == "":
			// An embedded non-struct (metav1.Duration's time.Duration)
			// has no fields to offer.
			if et := deref(f.Type); et.Kind() == reflect.Struct {
				collect(et, names)
			}
		case tag != "" && tag != "-":
			*names = append(*names, tag)
		}
	}
}
