package iptables

// ruleArgs are the arguments of one of our rules that its readers
// (Describe, ProxyPortsInKernel) look at, as written.
type ruleArgs struct {
	proto, src, dst, comment string
	dport                    string // --dport
	dports                   string // --dports (a guard rule's list)
	target                   string // -j
	to                       string // --to-ports or --to-destination
	// origDst, origDport: --ctorigdst and --ctorigdstport, the service
	// address a source-range rule matches before the portal's DNAT.
	origDst, origDport string
	// notDNAT: "! --ctstate DNAT" (the guard's); negated: any "!" but
	// that of a destination, which notDst holds ("! -d ::1/128", an IPv6
	// NodePort rule's).
	notDNAT, negated bool
	notDst           string
}

// readRuleArgs reads args, a rule split as splitRule splits it (without
// "-A CHAIN").
func readRuleArgs(args []string) ruleArgs {
	var a ruleArgs
	for i := 0; i < len(args); i++ {
		next := func() string {
			if i+1 < len(args) {
				i++
				return args[i]
			}
			return ""
		}
		switch args[i] {
		case "-p":
			a.proto = next()
		case "-s":
			a.src = next()
		case "-d":
			a.dst = next()
		case "--comment":
			a.comment = next()
		case "--dport":
			a.dport = next()
		case "--dports":
			a.dports = next()
		case "-j":
			a.target = next()
		case "--to-ports", "--to-destination":
			a.to = next()
		case "--ctorigdst":
			a.origDst = next()
		case "--ctorigdstport":
			a.origDport = next()
		case "!":
			if i+2 < len(args) && args[i+1] == "-d" {
				a.notDst = args[i+2]
				i += 2
				continue
			}
			a.negated = true
			if i+2 < len(args) && args[i+1] == "--ctstate" && args[i+2] == "DNAT" {
				a.notDNAT = true
			}
		}
	}
	return a
}
