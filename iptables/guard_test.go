package iptables

import (
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"
)

func TestGuardRules(t *testing.T) {
	const tail = " -m conntrack --ctstate NEW -m conntrack ! --ctstate DNAT -j DROP"
	keys := func(proto Protocol, ports ...int) []guardKey {
		var out []guardKey
		for _, p := range ports {
			out = append(out, guardKey{proto, p})
		}
		return out
	}
	for _, tc := range []struct {
		name string
		keys []guardKey
		want []string
	}{
		{"none", nil, nil},
		{"one port keeps the single-port form", keys(TCP, 40001), []string{"-p tcp -m tcp --dport 40001" + tail}},
		{"a block's ports share a rule, runs as ranges, in port order",
			keys(TCP, 40009, 40001, 40003, 40004, 40005, 40001),
			[]string{"-p tcp -m multiport --dports 40001,40003:40005,40009" + tail}},
		{"blocks of 16 port numbers", keys(TCP, 40015, 40016, 40017),
			[]string{"-p tcp -m tcp --dport 40015" + tail, "-p tcp -m multiport --dports 40016:40017" + tail}},
		{"protocols apart", append(keys(UDP, 53, 54), keys(TCP, 53)...),
			[]string{"-p tcp -m tcp --dport 53" + tail, "-p udp -m multiport --dports 53:54" + tail}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, buckets := guardRuleSet(sortedGuardKeys(tc.keys), true)
			if !slices.Equal(got, tc.want) {
				t.Errorf("got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(tc.want, "\n"))
			}
			if len(buckets) != len(got) {
				t.Errorf("%d buckets for %d rules", len(buckets), len(got))
			}
		})
	}
}

// Every subset of a block fits one multiport match (15 ports, a range
// counting two) and covers exactly its ports.
func TestGuardRuleEveryBlockPattern(t *testing.T) {
	const base = 40000 // a multiple of guardBlock
	for mask := 1; mask < 1<<guardBlock; mask++ {
		var ports []int
		for i := range guardBlock {
			if mask&(1<<i) != 0 {
				ports = append(ports, base+i)
			}
		}
		var keys []guardKey
		for _, p := range ports {
			keys = append(keys, guardKey{TCP, p})
		}
		rules, _ := guardRuleSet(keys, true)
		if len(rules) != 1 {
			t.Fatalf("ports %v: %d rules, want 1", ports, len(rules))
		}
		covered, slots := guardRulePorts(t, rules[0])
		if !slices.Equal(covered, ports) || slots > 15 {
			t.Fatalf("ports %v: rule %q covers %v in %d slots", ports, rules[0], covered, slots)
		}
	}
}

// Up to guardGroupAbove ports the guard keeps one rule per port, the
// legacy layout; past it, ports are grouped.
func TestGuardGroupsOnlyManyPorts(t *testing.T) {
	var keys []guardKey
	for i := range guardGroupAbove {
		keys = append(keys, guardKey{TCP, 40000 + i})
	}
	if rules, _ := guardRules(slices.Clone(keys)); len(rules) != guardGroupAbove || !strings.Contains(rules[0], " -m tcp --dport 40000 ") {
		t.Errorf("%d ports: %d rules, first %q; want one -m tcp --dport rule per port", guardGroupAbove, len(rules), rules[0])
	}
	keys = append(keys, guardKey{TCP, 40000 + guardGroupAbove})
	if rules, _ := guardRules(keys); len(rules) != (guardGroupAbove+1+guardBlock-1)/guardBlock {
		t.Errorf("%d ports: %d rules, want them grouped by %d", guardGroupAbove+1, len(rules), guardBlock)
	}
}

// The guard stays small when proxy ports sit together, and changing one
// port changes one rule.
func TestGuardRulesScale(t *testing.T) {
	var keys []guardKey
	for i := range 10000 {
		keys = append(keys, guardKey{TCP, 20000 + i})
	}
	before, _ := guardRules(slices.Clone(keys))
	if len(before) != 10000/guardBlock {
		t.Fatalf("10,000 consecutive ports: %d rules, want %d", len(before), 10000/guardBlock)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	gone := rng.IntN(len(keys))
	after, _ := guardRules(slices.Delete(slices.Clone(keys), gone, gone+1))
	changed := 0
	for i := range before {
		if before[i] != after[i] {
			changed++
		}
	}
	if len(after) != len(before) || changed != 1 {
		t.Errorf("one port gone: %d of %d rules changed (now %d rules), want 1", changed, len(before), len(after))
	}
}

// guardRulePorts reads back the ports a guard rule covers and the
// multiport slots it uses.
func guardRulePorts(t *testing.T, rule string) (ports []int, slots int) {
	t.Helper()
	f := strings.Fields(rule)
	i := slices.Index(f, "--dports")
	if i < 0 {
		i = slices.Index(f, "--dport")
		p, err := strconv.Atoi(f[i+1])
		if err != nil {
			t.Fatal(err)
		}
		return []int{p}, 1
	}
	for _, part := range strings.Split(f[i+1], ",") {
		lo, hi, isRange := strings.Cut(part, ":")
		a, err := strconv.Atoi(lo)
		if err != nil {
			t.Fatal(err)
		}
		b := a
		slots++
		if isRange {
			slots++
			if b, err = strconv.Atoi(hi); err != nil {
				t.Fatal(err)
			}
		}
		for p := a; p <= b; p++ {
			ports = append(ports, p)
		}
	}
	return ports, slots
}

func TestGuardRuleCovering(t *testing.T) {
	r := New(NewFakeRunner(IPv4), testConfig)
	many := r.Render(manyPortals(300)) // proxy ports 20000-20299, grouped
	few := r.Render(webPortals())
	for _, tc := range []struct {
		input []byte
		proto Protocol
		port  int
		want  string
	}{
		{many, TCP, 20005, "-A KUBE-PROXY-PORT-GUARD -p tcp -m multiport --dports 20000:20015 "},
		{many, TCP, 20299, "-A KUBE-PROXY-PORT-GUARD -p tcp -m multiport --dports 20288:20299 "},
		{many, UDP, 20005, ""},
		{many, TCP, 20300, ""},
		{few, TCP, 40001, "-A KUBE-PROXY-PORT-GUARD -p tcp -m tcp --dport 40001 "},
		{few, UDP, 40002, "-A KUBE-PROXY-PORT-GUARD -p udp -m udp --dport 40002 "},
		{few, TCP, 40002, ""}, // a UDP proxy port
	} {
		got := GuardRuleCovering(tc.input, ChainProxyPortGuard, tc.proto, tc.port)
		if !strings.HasPrefix(got, tc.want) || (tc.want == "") != (got == "") {
			t.Errorf("%s %d: %q, want %q...", tc.proto, tc.port, got, tc.want)
		}
	}
}

func TestGuardRulePorts(t *testing.T) {
	proto, ports, rest, ok := GuardRulePorts("-p udp -m multiport --dports 53,60:62 -m conntrack --ctstate NEW -j DROP")
	if !ok || proto != UDP || !slices.Equal(ports, []int{53, 60, 61, 62}) || rest != "-m conntrack --ctstate NEW -j DROP" {
		t.Errorf("got %v %v %q %v", proto, ports, rest, ok)
	}
	for _, bad := range []string{"-j KUBE-PROXY-PORT-GUARD-03", "-p tcp -j DROP", "-p tcp --dports 9:3 -j DROP", "-p tcp --dport x -j DROP"} {
		if _, _, _, ok := GuardRulePorts(bad); ok {
			t.Errorf("%q read as a guard rule", bad)
		}
	}
}
