package demo

import (
	"bytes"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestWrap(t *testing.T) {
	for _, tc := range []struct {
		in    string
		width int
		want  []string
	}{
		{"", 10, []string{""}},
		{"short", 10, []string{"short"}},
		{"two words", 4, []string{"two", "word", "s"}},
		{"fits exactly", 12, []string{"fits exactly"}},
		{"a b c d", 3, []string{"a b", "c d"}},
		{"backend-with-a-long-name", 10, []string{"backend-wi", "th-a-long-", "name"}},
		{"x  spaced   out ", 20, []string{"x spaced out"}},
		{"über straße", 5, []string{"über", "straß", "e"}},
	} {
		if got := wrap(tc.in, tc.width); !slices.Equal(got, tc.want) {
			t.Errorf("wrap(%q, %d) = %q, want %q", tc.in, tc.width, got, tc.want)
		}
	}
}

// TestTableFitsItsColumns renders tables with long backend names at several
// widths and checks, line by line, that no cell runs into the next column
// or past the width, and that no word is lost.
func TestTableFitsItsColumns(t *testing.T) {
	long := "backend-" + strings.Repeat("averyveryverylongname", 4)
	rows := []tableRow{
		{cells: []string{"no affinity: client 1 opens 30 connections", "11/10/9 over the 3 pods (random)", "10/10/10 (in turn)", "yes"}},
		{cells: []string{"client IP affinity: client 1 opens 30 connections", "30/30 on one pod", "30/30 on " + long, "yes"},
			notes: []string{"client 1 was kept on " + long + "; it was deleted from the Service's endpoints"}},
		{cells: []string{"client 2", "30/30 on one pod, client 1 on another", "30/30 on " + long + ", client 1 on " + long, "NO"}},
	}
	withoutNotes := make([]tableRow, len(rows))
	for i, r := range rows {
		withoutNotes[i] = tableRow{cells: r.cells}
	}
	for _, width := range []int{60, 80, 100, 200} {
		for _, indent := range []string{"", "  "} {
			// Notes span the table, so the columns are read on a table
			// without them, and the notes' words looked for in the other.
			tt := textTable{titles: []string{"experiment", "real cluster (kube-proxy)", "this proxy", "same?"}, rows: withoutNotes, width: width, indent: indent}
			var out bytes.Buffer
			tt.render(&out)
			widths := tt.columnWidths()
			text := out.String()
			lines := strings.Split(strings.TrimSuffix(text, "\n"), "\n")
			cols := make([][]string, len(widths)) // each column's text, line by line
			for _, line := range lines {
				if n := utf8.RuneCountInString(line); n > width {
					t.Errorf("width %d: line of %d runes:\n%s", width, n, line)
				}
				if line != "" && !strings.HasPrefix(line, indent) {
					t.Errorf("width %d: line lacks the indent %q: %q", width, indent, line)
				}
				body := []rune(strings.TrimPrefix(line, indent))
				if len(body) == 0 {
					continue // the blank line between rows
				}
				at := 0
				for i, wd := range widths {
					end := min(at+wd, len(body))
					if at < len(body) {
						cols[i] = append(cols[i], strings.TrimSpace(string(body[at:end])))
					}
					gap := body[end:min(end+len(columnGap), len(body))]
					if strings.TrimSpace(string(gap)) != "" {
						t.Errorf("width %d: column %d runs into the next on %q", width, i, line)
					}
					at = end + len(columnGap)
				}
			}
			// Every word of every cell is in its own column.
			joined := make([]string, len(cols))
			for i, c := range cols {
				joined[i] = strings.ReplaceAll(strings.Join(c, ""), " ", "")
			}
			for _, r := range rows {
				for i, cell := range r.cells {
					if !strings.Contains(joined[i], strings.ReplaceAll(cell, " ", "")) {
						t.Errorf("width %d: column %d lost %q", width, i, cell)
					}
				}
			}
			tt.rows = rows
			out.Reset()
			tt.render(&out)
			for _, line := range strings.Split(out.String(), "\n") {
				if n := utf8.RuneCountInString(line); n > width {
					t.Errorf("width %d: line of %d runes with notes:\n%s", width, n, line)
				}
			}
			for _, r := range rows {
				for _, n := range r.notes {
					if !strings.Contains(strings.Join(strings.Fields(out.String()), ""), strings.ReplaceAll(n, " ", "")) {
						t.Errorf("width %d: note lost: %q", width, n)
					}
				}
			}
			if t.Failed() {
				t.Fatalf("width %d indent %q:\n%s", width, indent, text)
			}
		}
	}
}

func TestTableColumnsAsWideAsTheirContent(t *testing.T) {
	tt := textTable{titles: []string{"a", "bb"}, rows: []tableRow{{cells: []string{"xxxx", "y"}}}, width: 100}
	if got := tt.columnWidths(); !slices.Equal(got, []int{4, 2}) {
		t.Errorf("widths = %v, want [4 2]", got)
	}
	var out bytes.Buffer
	tt.render(&out)
	if want := "a     bb\n----  --\nxxxx  y\n"; out.String() != want {
		t.Errorf("rendered\n%s\nwant\n%s", out.String(), want)
	}
}
