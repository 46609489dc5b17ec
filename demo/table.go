package demo

import (
	"fmt"
	"io"
	"strings"
	"unicode/utf8"
)

// Why the table is printed whole, after the experiments: its columns are as
// wide as their longest cell (a backend may have a long name), and that is
// known only once every row is measured. While the experiments run, a dot
// per finished row shows progress instead.

// DefaultWidth is the width the tables fit in when the terminal's is not
// known (output to a file or a pipe).
const DefaultWidth = 100

// minColumn is the narrowest a text column is squeezed to before the table
// is let to grow past the width.
const minColumn = 12

const columnGap = "  "

// textTable is a table of text cells that wraps each cell inside its column
// so that no line runs into the next column or past width. Without titles
// it is an aligned list.
type textTable struct {
	titles []string
	rows   []tableRow
	width  int
	// indent prints before every line (an aligned list inside a
	// paragraph); it counts in width.
	indent string
}

// tableRow is one row's cells and the notes printed under it, across the
// whole table.
type tableRow struct {
	cells []string
	notes []string
}

// columnWidths gives each column its longest cell's width, then, when the
// total passes t.width, takes from the widest columns until it fits: first
// only down to a column's longest word (a cell then wraps between words),
// then, if that is not enough, down to minColumn (words are cut). A table
// whose columns are all at minColumn may still be wider than t.width.
func (t *textTable) columnWidths() []int {
	n := len(t.titles)
	for _, r := range t.rows {
		n = max(n, len(r.cells))
	}
	widths := make([]int, n)
	words := make([]int, n) // each column's longest word
	measure := func(cells []string) {
		for i, c := range cells {
			widths[i] = max(widths[i], utf8.RuneCountInString(c))
			for _, word := range strings.Fields(c) {
				words[i] = max(words[i], utf8.RuneCountInString(word))
			}
		}
	}
	measure(t.titles)
	for _, r := range t.rows {
		measure(r.cells)
	}
	budget := t.width - len(columnGap)*(n-1) - utf8.RuneCountInString(t.indent)
	for _, floor := range []func(i int) int{
		func(i int) int { return max(minColumn, words[i]) },
		func(int) int { return minColumn },
	} {
		for sum(widths) > budget {
			widest := -1
			for i, w := range widths {
				if w > floor(i) && (widest < 0 || w > widths[widest]) {
					widest = i
				}
			}
			if widest < 0 {
				break
			}
			widths[widest]--
		}
	}
	return widths
}

func sum(xs []int) int {
	s := 0
	for _, x := range xs {
		s += x
	}
	return s
}

// render writes the titles, a rule under them and every row, each cell
// wrapped to its column; notes are wrapped to the table's whole width under
// their row.
func (t *textTable) render(w io.Writer) {
	widths := t.columnWidths()
	total := sum(widths) + len(columnGap)*(len(widths)-1)
	if t.titles != nil {
		t.line(w, widths, t.titles)
		rules := make([]string, len(widths))
		for i, wd := range widths {
			rules[i] = strings.Repeat("-", wd)
		}
		t.line(w, widths, rules)
	}
	// When a row needs more than one line, a blank line between rows shows
	// where each ends.
	spaced := false
	for _, r := range t.rows {
		for i, c := range r.cells {
			spaced = spaced || len(wrap(c, widths[i])) > 1
		}
	}
	for i, r := range t.rows {
		if spaced && i > 0 {
			fmt.Fprintln(w)
		}
		t.line(w, widths, r.cells)
		for _, n := range r.notes {
			for i, l := range wrap(n, total-4) { // total: the columns, without the indent
				lead := "  └ "
				if i > 0 {
					lead = "    "
				}
				fmt.Fprintln(w, t.indent+lead+l)
			}
		}
	}
}

// line prints one row, as many physical lines as its tallest cell needs.
func (t *textTable) line(w io.Writer, widths []int, cells []string) {
	wrapped := make([][]string, len(widths))
	height := 1
	for i := range widths {
		cell := ""
		if i < len(cells) {
			cell = cells[i]
		}
		wrapped[i] = wrap(cell, widths[i])
		height = max(height, len(wrapped[i]))
	}
	for h := range height {
		var b strings.Builder
		b.WriteString(t.indent)
		for i, wd := range widths {
			part := ""
			if h < len(wrapped[i]) {
				part = wrapped[i][h]
			}
			if i > 0 {
				b.WriteString(columnGap)
			}
			b.WriteString(part)
			b.WriteString(strings.Repeat(" ", wd-utf8.RuneCountInString(part)))
		}
		fmt.Fprintln(w, strings.TrimRight(b.String(), " "))
	}
}

// wrap breaks s into lines of at most width runes, at spaces where it can
// and inside a word longer than the line where it must.
func wrap(s string, width int) []string {
	width = max(width, 1)
	var lines []string
	var cur []rune
	flush := func() {
		lines = append(lines, string(cur))
		cur = cur[:0]
	}
	for _, word := range strings.Fields(s) {
		wr := []rune(word)
		if len(cur) > 0 && len(cur)+1+len(wr) > width {
			flush()
		}
		if len(cur) > 0 {
			cur = append(cur, ' ')
		}
		for len(cur)+len(wr) > width {
			room := width - len(cur)
			cur = append(cur, wr[:room]...)
			wr = wr[room:]
			flush()
		}
		cur = append(cur, wr...)
	}
	if len(cur) > 0 || len(lines) == 0 {
		flush()
	}
	return lines
}
