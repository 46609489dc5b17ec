package main

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

// Every flag --help lists has a row in one of README.md's flag tables,
// where users look flags up (--vmodule was listed by --help only).
func TestEveryFlagInREADME(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	// A row's first cell names the flag, perhaps with others: "| `--version`, `--help` |".
	var rows strings.Builder
	for _, line := range strings.Split(string(readme), "\n") {
		if strings.HasPrefix(line, "| `-") {
			first, _, _ := strings.Cut(line[1:], "|")
			rows.WriteString(first + "\n")
		}
	}
	cells := rows.String()
	help := captureStdout(t, func() { runMain([]string{"--help"}) })
	flagName := regexp.MustCompile(`^\s+(?:-(\w), )?--([\w-]+)`)
	n := 0
	for _, line := range strings.Split(help, "\n") {
		m := flagName.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		n++
		documented := func(name string) bool {
			return strings.Contains(cells, name+" ") || strings.Contains(cells, name+"`") || strings.Contains(cells, name+"=")
		}
		if !documented("`--"+m[2]) && (m[1] == "" || !documented("`-"+m[1])) {
			t.Errorf("--%s is in --help but has no row in README.md's flag tables", m[2])
		}
	}
	if n < 20 {
		t.Fatalf("found %d flags in --help:\n%s", n, help)
	}
}
