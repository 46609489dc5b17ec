package main

import (
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/spf13/pflag"
)

// Every flag --help lists has a row in one of README.md's flag tables,
// where users look flags up (--vmodule was listed by --help only).
func TestEveryFlagInREADME(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	// A row's first cell names the flag, perhaps with others ("| `--version`,
	// `--help` |"); the row of kube-proxy's flags this proxy does not act
	// on lists them in its last cell, "`--ipvs-*`" standing for a family.
	var rows strings.Builder
	for _, line := range strings.Split(string(readme), "\n") {
		switch {
		case strings.HasPrefix(line, "| `-"):
			first, _, _ := strings.Cut(line[1:], "|")
			rows.WriteString(first + "\n")
		case strings.HasPrefix(line, "| kube-proxy's flags"):
			rows.WriteString(line + "\n")
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
			if strings.Contains(cells, name+" ") || strings.Contains(cells, name+"`") || strings.Contains(cells, name+"=") {
				return true
			}
			for i := range len(name) {
				if name[i] == '-' && i > 3 && strings.Contains(cells, name[:i+1]+"*`") {
					return true
				}
			}
			return false
		}
		if !documented("`--"+m[2]) && (m[1] == "" || !documented("`-"+m[1])) {
			t.Errorf("--%s is in --help but has no row in README.md's flag tables", m[2])
		}
	}
	if n < 20 {
		t.Fatalf("found %d flags in --help:\n%s", n, help)
	}
}

// The default --udp-max-sessions-per-port is lowered with the total (half
// the descriptors, half the ephemeral ports: 3,529 on a node with the
// default range, whatever its descriptor limit), which --help and README's
// row of the flag said nothing of: both named 16384 alone, and only the
// --udp-max-sessions row told.
func TestUDPPerPortDefaultSaysItIsLowered(t *testing.T) {
	o := newOptions()
	fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
	o.addFlags(fs)
	if usage := fs.Lookup("udp-max-sessions-per-port").Usage; !strings.Contains(usage, "lowered") {
		t.Errorf("--help of --udp-max-sessions-per-port does not say its default is lowered with the total: %q", usage)
	}
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(readme), "\n") {
		if strings.HasPrefix(line, "| `--udp-max-sessions-per-port N`") && !strings.Contains(line, "lowered") {
			t.Errorf("README's row of --udp-max-sessions-per-port does not say its default is lowered with the total:\n%s", line)
		}
	}
}

// README speaks to a reader from outside the project: the words of its
// tracker and its sessions ("the targets", "(sweep 10)") mean
// nothing to a newcomer, who was told of targets never stated. Issue 12
// had them replaced once, and they came back with later measurements
// ("sweep 15: 11,000 clients", which "(sweep N)" alone did not match).
func TestREADMEHasNoProjectJargon(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	jargon := regexp.MustCompile(`(?i)\bthe issue's\b|\bsweep \d+\b|\bseed 000\b|\bthe final run\b`)
	for i, line := range strings.Split(string(readme), "\n") {
		if m := jargon.FindString(line); m != "" {
			t.Errorf("README.md:%d says %q, a word of the project's own tracker; say what it stands for:\n%s", i+1, m, line)
		}
	}
}

// README's pointers resolve: each link to an anchor names a heading (as
// GitHub derives its anchor), each relative link a file of the repository,
// and each "see Name" in the prose a heading called Name. The
// --tcp-max-connections-per-port row said "(see Limits)", a section that
// does not exist (its table is under Reliability).
func TestREADMEPointersResolve(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	// Code blocks hold shell comments ("# manifests, ...") that are no
	// headings, and commands that are no links.
	prose := regexp.MustCompile("(?s)```.*?```").ReplaceAllString(string(readme), "")
	headings := map[string]bool{}
	anchors := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^#+ (.+)$`).FindAllStringSubmatch(prose, -1) {
		headings[m[1]] = true
		anchor := strings.ToLower(m[1])
		anchor = regexp.MustCompile(`[^\w\- ]`).ReplaceAllString(anchor, "")
		anchors[strings.ReplaceAll(anchor, " ", "-")] = true
	}
	for _, m := range regexp.MustCompile(`\]\(([^)\s]+)\)`).FindAllStringSubmatch(prose, -1) {
		target := m[1]
		switch {
		case strings.HasPrefix(target, "http://"), strings.HasPrefix(target, "https://"):
		case strings.HasPrefix(target, "#"):
			if !anchors[target[1:]] {
				t.Errorf("README.md links to %s, which no heading makes", target)
			}
		default:
			path, _, _ := strings.Cut(target, "#")
			if _, err := os.Stat("../../" + path); err != nil {
				t.Errorf("README.md links to %s: %v", target, err)
			}
		}
	}
	for _, m := range regexp.MustCompile(`\bsee ([A-Z][a-z]+)\b`).FindAllStringSubmatch(prose, -1) {
		if !headings[m[1]] {
			t.Errorf("README.md says %q, and no heading is called %s", m[0], m[1])
		}
	}
}

// DESIGN.md: "The added flags are marked "(added)" in the README's flag
// table": the flags that are neither kube-proxy's nor the design card's.
// --state-file and --fault-max-active were not marked.
func TestREADMEMarksAddedFlags(t *testing.T) {
	// kube-proxy's flags this proxy acts on (the ones it does not act on
	// have a section of --help and a row of their own), and the card's.
	notAdded := map[string]bool{}
	for _, name := range strings.Fields(`bind-address bind-address-hard-fail cleanup cluster-cidr config
		config-sync-period healthz-bind-address hostname-override init-only iptables-min-sync-period
		iptables-sync-period kube-api-burst kube-api-content-type kube-api-qps kubeconfig master
		metrics-bind-address nodeport-addresses proxy-mode proxy-port-range udp-timeout write-config-to
		v vmodule version help
		manifests iptables fault-api-bind-address fault-seed`) {
		notAdded[name] = true
	}
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	// rowOf returns the row whose first cell names --name.
	rowOf := func(name string) string {
		for _, line := range strings.Split(string(readme), "\n") {
			if !strings.HasPrefix(line, "| `-") {
				continue
			}
			first, _, _ := strings.Cut(line[1:], "|")
			if strings.Contains(first, "`--"+name+" ") || strings.Contains(first, "`--"+name+"`") {
				return line
			}
		}
		return ""
	}
	help := captureStdout(t, func() { runMain([]string{"--help"}) })
	// Up to the section of kube-proxy's flags this proxy does not act on.
	help, _, _ = strings.Cut(help, "\nkube-proxy flags accepted and not acted on")
	flagName := regexp.MustCompile(`^\s+(?:-\w, )?--([\w-]+)`)
	n := 0
	for _, line := range strings.Split(help, "\n") {
		m := flagName.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		n++
		row := rowOf(m[1])
		if row == "" {
			continue // TestEveryFlagInREADME's to report
		}
		if marked := strings.Contains(row, "(added)"); marked == notAdded[m[1]] {
			if marked {
				t.Errorf("README.md's row of --%s says \"(added)\", but the flag is kube-proxy's or the design card's", m[1])
			} else {
				t.Errorf("README.md's row of --%s does not say \"(added)\": the flag is neither kube-proxy's nor the design card's", m[1])
			}
		}
	}
	if n < 20 {
		t.Fatalf("found %d flags in --help:\n%s", n, help)
	}
}
