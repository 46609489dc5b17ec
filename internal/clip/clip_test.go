package clip

import (
	"fmt"
	"strings"
	"testing"
)

func TestQuote(t *testing.T) {
	long := strings.Repeat("5", 300000) + "s"
	for _, tc := range []struct{ in, want string }{
		{"5x", `"5x"`},
		{strings.Repeat("a", Max), `"` + strings.Repeat("a", Max) + `"`},
		{long, `"` + strings.Repeat("5", Max) + `"... (300001 bytes)`},
		// A rune is not cut.
		{"a" + strings.Repeat("é", Max), `"a` + strings.Repeat("é", (Max-2)/2) + `"... (` + fmt.Sprint(1+2*Max) + ` bytes)`},
	} {
		if got := Quote(tc.in); got != tc.want {
			t.Errorf("Quote(%.20q...) = %.300s, want %.300s", tc.in, got, tc.want)
		}
	}
	if got, want := String(long), strings.Repeat("5", Max)+"... (300001 bytes)"; got != want {
		t.Errorf("String = %.300s, want %.300s", got, want)
	}
}

type protocol string

func TestArgsAndValue(t *testing.T) {
	long := strings.Repeat("x", 1000)
	got := fmt.Sprintf("%q is not valid, nor %q, nor %s (%d)", Args([]any{protocol(long), "short", long, 7})...)
	want := `"` + strings.Repeat("x", Max) + `"... (1000 bytes) is not valid, nor "short", nor ` + strings.Repeat("x", Max) + `... (1000 bytes) (7)`
	if got != want {
		t.Errorf("got  %s\nwant %s", got, want)
	}
}

func TestQuoted(t *testing.T) {
	long := strings.Repeat("k", 5000)
	msg := `line 3: key "` + long + `" already set in map; unknown field "spec.x", value "a\"b` + long + `"`
	got := Quoted(msg)
	want := `line 3: key "` + strings.Repeat("k", Max) + `"... (5000 bytes) already set in map; unknown field "spec.x", value "a\"b` + strings.Repeat("k", Max-3) + `"... (5003 bytes)`
	if got != want {
		t.Errorf("got  %s\nwant %s", got, want)
	}
	if short := `field "x"`; Quoted(short) != short {
		t.Errorf("Quoted(%q) changed it", short)
	}
}
