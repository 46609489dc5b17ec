package iptables

import (
	"bufio"
	"bytes"
	"fmt"
	"slices"
	"strings"
	"unicode/utf8"
)

// This file speaks the iptables-save / iptables-restore text format: how a
// rule's arguments are printed (so our rendering matches the kernel's
// read-back byte for byte) and how a dump is split into chains.

// unquoted holds the characters iptables-save prints without quotes
// (xtables_save_string); anything else makes it quote the whole value.
const unquoted = "_-0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"

// quoteSaveString prints a free-text value (a comment) the way iptables-save
// does: bare when it is a plain word, otherwise in double quotes with ", \
// and ' escaped by a backslash.
func quoteSaveString(s string) string {
	if s != "" && strings.Trim(s, unquoted) == "" {
		return s
	}
	if !strings.ContainsAny(s, `"\'`) {
		return `"` + s + `"`
	}
	var b strings.Builder
	b.WriteByte('"')
	for _, r := range s {
		if r == '"' || r == '\\' || r == '\'' {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	b.WriteByte('"')
	return b.String()
}

// joinRule prints rule arguments as one iptables-save line fragment.
// Only comment values are free text; every other argument we generate is a
// plain token.
func joinRule(args []string) string {
	out := make([]string, len(args))
	for i, a := range args {
		if i > 0 && args[i-1] == "--comment" {
			a = quoteSaveString(a)
		}
		out[i] = a
	}
	return strings.Join(out, " ")
}

// splitRule splits a saved rule line into arguments, undoing the quoting of
// quoteSaveString (double quotes, backslash escapes). Arguments are built
// in one buffer (the fake runner splits every restored line: a Builder
// per argument was 0.4 million allocations in a 10,000-Service sync);
// rune by rune, as quoteSaveString, so invalid UTF-8 reads the same.
func splitRule(line string) ([]string, error) {
	var args []string
	cur := make([]byte, 0, len(line))
	inArg, quoted, escaped := false, false, false
	for _, r := range line {
		switch {
		case escaped:
			cur = utf8.AppendRune(cur, r)
			escaped = false
		case r == '\\':
			escaped, inArg = true, true
		case r == '"':
			quoted, inArg = !quoted, true
		case (r == ' ' || r == '\t') && !quoted:
			if inArg {
				args = append(args, string(cur))
				cur = cur[:0]
				inArg = false
			}
		default:
			cur = utf8.AppendRune(cur, r)
			inArg = true
		}
	}
	if quoted || escaped {
		return nil, fmt.Errorf("unterminated quote in rule %q", line)
	}
	if inArg {
		args = append(args, string(cur))
	}
	return args, nil
}

// savedTable is one table of an iptables-save dump: which chains exist and
// each chain's rules, in order, as printed after "-A CHAIN ".
type savedTable struct {
	chains map[string]bool
	rules  map[string][]string
}

// parseSave reads the given table out of iptables-save output. A dump that
// lacks the table (nothing created yet) yields an empty table.
func parseSave(data []byte, table Table) (savedTable, error) {
	t := savedTable{chains: map[string]bool{}, rules: map[string][]string{}}
	in := false
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 64*1024), 16*1024*1024)
	n := 0
	for sc.Scan() {
		// Trailing blanks and CRs carry nothing (iptables-save never ends a
		// rule with one) but would make a rule differ from its rendering.
		raw := bytes.TrimRight(sc.Bytes(), " \t\r")
		n++
		// The dump holds every table: lines of the others are skipped
		// before they are copied into strings.
		if len(raw) == 0 || raw[0] == '#' || (!in && raw[0] != '*') {
			continue
		}
		line := string(raw)
		switch {
		case strings.HasPrefix(line, "*"):
			in = line[1:] == string(table)
		case line == "COMMIT":
			in = false
		case strings.HasPrefix(line, ":"):
			name, _, _ := strings.Cut(line[1:], " ")
			if !validChainName(name) {
				return t, fmt.Errorf("iptables-save output for table %s, line %d: bad chain name %q", table, n, name)
			}
			t.chains[name] = true
		case strings.HasPrefix(line, "-A "):
			chain, rule, _ := strings.Cut(line[3:], " ")
			if !validChainName(chain) {
				return t, fmt.Errorf("iptables-save output for table %s, line %d: bad chain name %q", table, n, chain)
			}
			t.chains[chain] = true
			t.rules[chain] = append(t.rules[chain], rule)
		default:
			return t, fmt.Errorf("iptables-save output for table %s, line %d: unexpected line %q", table, n, line)
		}
	}
	if err := sc.Err(); err != nil {
		return t, fmt.Errorf("iptables-save output for table %s, after line %d: %w", table, n, err)
	}
	return t, nil
}

// validChainName: iptables prints a chain name as one non-empty word.
func validChainName(name string) bool {
	return name != "" && !strings.ContainsAny(name, " \t\r\n\v\f")
}

// ruleTarget returns the -j target of a saved rule line.
func ruleTarget(rule string) string {
	args, _ := splitRule(rule)
	if i := slices.Index(args, "-j"); i >= 0 && i+1 < len(args) {
		return args[i+1]
	}
	return ""
}
