package iptables

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
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
	// skipped counts the lines of the table parseSave did not understand.
	skipped int
	// unprintable is the line iptables-save printed instead of the table
	// (see unprintable), set by Rules.readBack; the table then reads as
	// empty, which it is not.
	unprintable string
}

// parseSave reads the given table out of iptables-save output. A dump that
// lacks the table (nothing created yet) yields an empty table.
//
// Of the dump we need the chain declarations, our chains' rules and the
// built-in chains' rules (where our jumps are). The rest is other tools'
// business: a line not understood is skipped (counted in skipped), never
// an error, as one foreign rule failed every sync of its family. A quoted
// value holding a newline (a comment "allow\nfrom admin", which iptables
// accepts) is printed across lines: those are joined back into their rule,
// so a continuation is read neither as a rule nor as a table's end. Should
// a quote never close (no iptables prints that), the dump is read line by
// line instead.
func parseSave(data []byte, table Table) (savedTable, error) {
	t, err := parseSaveLines(data, table, true)
	if errors.Is(err, errUnclosedQuote) {
		return parseSaveLines(data, table, false)
	}
	return t, err
}

var errUnclosedQuote = errors.New("a quoted value is never closed")

// unprintable returns the line iptables-save prints in place of table when
// it cannot decode the table's rules ("# Table `nat' is incompatible, use
// 'nft' tool.": iptables-nft meeting an expression a newer iptables-nft or
// nft itself wrote), exiting 0. parseSave reads such a dump as one without
// the table; a sync must not: our chains and jumps are in the kernel all
// the same, and taken for missing, each sync inserted another copy of every
// jump. Only that line: iptables-nft 1.8.8 on also prints "# Table `nat'
// contains incompatible base-chains, use 'nft' tool to list them." over a
// table holding another tool's base chain, and then the whole table, which
// is read as any other (taken for unprintable, each sync that wrote a chain
// there failed).
func unprintable(data []byte, table Table) (string, bool) {
	prefix := []byte("# Table `" + string(table) + "' is incompatible")
	for line := range bytes.Lines(data) {
		if bytes.HasPrefix(line, prefix) {
			return string(bytes.TrimSpace(line)), true
		}
	}
	return "", false
}

func parseSaveLines(data []byte, table Table, joinQuoted bool) (savedTable, error) {
	t := savedTable{chains: map[string]bool{}, rules: map[string][]string{}}
	in := false
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 64*1024), 16*1024*1024)
	sc.Split(scanNewlines)
	n := 0
	var quote quoteState // of the rule being continued
	var cont []byte      // that rule so far, when in the table
	addRule := func(line string) {
		chain, rule, _ := strings.Cut(line[3:], " ")
		if !validChainName(chain) {
			t.skipped++
			return
		}
		t.chains[chain] = true
		t.rules[chain] = append(t.rules[chain], rule)
	}
	for sc.Scan() {
		n++
		if quote.open() {
			quote = quote.scan(sc.Bytes())
			if in {
				cont = append(append(cont, '\n'), sc.Bytes()...)
			}
			if !quote.open() && in {
				addRule(string(bytes.TrimRight(cont, " \t\r")))
			}
			continue
		}
		// Trailing blanks and CRs carry nothing (iptables-save never ends a
		// rule with one) but would make a rule differ from its rendering.
		raw := bytes.TrimRight(sc.Bytes(), " \t\r")
		if joinQuoted && bytes.HasPrefix(raw, []byte("-A ")) {
			// The rule after the chain name (which may hold a quote).
			// Blanks at the end of a line that leaves a quote open are
			// the quoted value's.
			_, rule, _ := bytes.Cut(sc.Bytes()[3:], []byte(" "))
			if quote = quote.scan(rule); quote.open() {
				if in {
					cont = append(cont[:0], sc.Bytes()...)
				}
				continue
			}
		}
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
			if name, _, _ := strings.Cut(line[1:], " "); validChainName(name) {
				t.chains[name] = true
			} else {
				t.skipped++
			}
		case strings.HasPrefix(line, "-A "):
			addRule(line)
		default:
			t.skipped++
		}
	}
	if err := sc.Err(); err != nil {
		return t, fmt.Errorf("iptables-save output for table %s, after line %d: %w", table, n, err)
	}
	if quote.open() {
		return t, errUnclosedQuote
	}
	return t, nil
}

// scanNewlines splits at each newline and nothing else: a CR before one
// is kept (bufio.ScanLines drops it), since inside a quoted value it is
// the value's, printed as it is; outside one it is trimmed as a blank.
func scanNewlines(data []byte, atEOF bool) (int, []byte, error) {
	if i := bytes.IndexByte(data, '\n'); i >= 0 {
		return i + 1, data[:i], nil
	}
	if atEOF && len(data) > 0 {
		return len(data), data, nil
	}
	return 0, nil, nil
}

// quoteState tells whether a rule line ends inside double quotes, read as
// iptables-save quotes (xtables_save_string): a quoted value is a whole
// argument, so only a quote at an argument's start opens one, and only as
// the value of an option iptables-save prints quoted (quotedOptions):
// names it prints bare may start with a quote (an interface "eth9, a
// chain "audit), and taking one for an opening swallowed the lines after
// it, our rules and the next table's header with them. Inside, a
// backslash escapes the next character.
type quoteState struct{ quoted bool }

// quotedOptions are the options whose values iptables-save prints through
// xtables_save_string, quoted. A newline can be only in some (--comment,
// -m helper --helper), but every one is tracked: an untracked value's
// closing quote, read with no quote open, opened one when the word before
// it was a tracked option (a cgroup named "/batch --comment ").
var quotedOptions = map[string]bool{
	"--comment": true, "--log-prefix": true, "--nflog-prefix": true,
	"--string": true, "--hex-string": true, "--helper": true,
	"--path": true, "--nfacct-name": true, "--bytecode": true, "--u32": true,
	"--led-trigger-id": true, "--ulog-prefix": true,
}

// quoteOpensAt reports whether the quote at line[i], at an argument's
// start, opens a quoted value: the argument before it is an option in
// quotedOptions.
func quoteOpensAt(line []byte, i int) bool {
	end := i
	for end > 0 && (line[end-1] == ' ' || line[end-1] == '\t') {
		end--
	}
	start := end
	for start > 0 && line[start-1] != ' ' && line[start-1] != '\t' {
		start--
	}
	return start < end && quotedOptions[string(line[start:end])]
}

func (q quoteState) open() bool { return q.quoted }

// scan returns the state after line (a rule's arguments, or a line that
// continues them), read from q. The newline ending the line is a character
// of its own, so a backslash before it escapes it.
func (q quoteState) scan(line []byte) quoteState {
	// By index searches, not rune by rune: every rule of ours has a
	// quoted comment, and this reads each line of the table.
	for i := 0; i < len(line); i++ {
		if !q.quoted {
			j := bytes.IndexByte(line[i:], '"')
			if j < 0 {
				break
			}
			// At an argument's start (so not after a backslash either),
			// as the value of an option printed quoted.
			if i += j; i > 0 && (line[i-1] == ' ' || line[i-1] == '\t') && quoteOpensAt(line, i) {
				q.quoted = true
			}
			continue
		}
		j := bytes.IndexAny(line[i:], `"\`)
		if j < 0 {
			break
		}
		if i += j; line[i] == '\\' {
			i++ // the escaped character (or the newline ending the line)
		} else {
			q.quoted = false
		}
	}
	return q
}

// validChainName: iptables prints a chain name as one non-empty word.
func validChainName(name string) bool {
	return name != "" && !strings.ContainsAny(name, " \t\r\n\v\f")
}

// ruleTarget returns the chain or target a saved rule line jumps (-j) or
// goes (-g) to: a goto into a chain of ours holds it as a jump does, and
// the value of an option printed quoted (a comment, a string match's
// --string, a cgroup's --path: free text) is not an option.
func ruleTarget(rule string) string {
	args, _ := splitRule(rule)
	for i := 0; i+1 < len(args); i++ {
		switch {
		case quotedOptions[args[i]]:
			i++
		case args[i] == "-j" || args[i] == "-g":
			return args[i+1]
		}
	}
	return ""
}
