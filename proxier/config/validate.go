package config

//lint:file-ignore SA1019 v1.Endpoints is read on purpose: manifests may hold them, and they are converted to EndpointSlices

import (
	"fmt"
	"net/netip"
	"strings"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/internal/clip"
)

// PortRange is an inclusive range of ports.
type PortRange struct{ Min, Max int32 }

func (r PortRange) contains(p int32) bool { return p >= r.Min && p <= r.Max }

func (r PortRange) String() string { return fmt.Sprintf("%d-%d", r.Min, r.Max) }

// DefaultNodePortRange is the API server's default --service-node-port-range.
var DefaultNodePortRange = PortRange{Min: 30000, Max: 32767}

// maxAffinityTimeoutSeconds is the API server's upper bound for
// sessionAffinityConfig.clientIP.timeoutSeconds (one day).
const maxAffinityTimeoutSeconds = 86400

// fieldErrors collects validation failures of one object.
type fieldErrors []*fieldError

// maxFieldErrors is how many of an object's failures its error lists; the
// rest are counted. Listed whole, 10,000 bad externalIPs were a 588 KB log
// line at each change of the file (and a 64 MiB file could make one of
// hundreds of MB).
const maxFieldErrors = 10

// add records a failure. The values it quotes are the object's, so each
// is quoted by a bounded prefix (clip.Args): a 300 KB externalIP was a
// 300 KB log line at each change of the file.
func (fe *fieldErrors) add(path *field.Path, format string, args ...any) {
	*fe = append(*fe, &fieldError{Path: path.String(), Msg: fmt.Sprintf(format, clip.Args(args)...)})
}

// addStrict records a failure only strict IP validation finds (fieldError.strict).
func (fe *fieldErrors) addStrict(path *field.Path, format string, args ...any) {
	fe.add(path, format, args...)
	(*fe)[len(*fe)-1].strict = true
}

// err joins the failures into one line, or returns nil when there are none.
func (fe fieldErrors) err() error {
	if len(fe) == 0 {
		return nil
	}
	msgs := make([]string, 0, min(len(fe), maxFieldErrors+1))
	for _, e := range fe[:min(len(fe), maxFieldErrors)] {
		msgs = append(msgs, e.Error())
	}
	if more := len(fe) - maxFieldErrors; more > 0 {
		msgs = append(msgs, fmt.Sprintf("and %d more", more))
	}
	return &fieldError{Msg: strings.Join(msgs, "; ")}
}

// validate checks what the proxy relies on in a defaulted object. It is not
// the API server's full validation: it rejects what would make the proxy
// misbehave or what is plainly a typo.
func validate(obj runtime.Object, nodePorts PortRange) error {
	var fe fieldErrors
	switch o := obj.(type) {
	case *v1.Service:
		validateService(&fe, o, nodePorts)
	case *discovery.EndpointSlice:
		validateEndpointSlice(&fe, o)
	case *v1.Endpoints:
		validateEndpoints(&fe, o)
	default:
		return fmt.Errorf("%T is not a manifest kind the proxy uses", obj)
	}
	return fe.err()
}

// dnsCheck runs one of apimachinery's name checks and records its failures.
func dnsCheck(fe *fieldErrors, path *field.Path, value string, check func(string) []string) {
	for _, msg := range check(value) {
		fe.add(path, "%q: %s", value, msg)
	}
}

func validateMeta(fe *fieldErrors, name, namespace string, nameCheck func(string) []string) {
	dnsCheck(fe, field.NewPath("metadata", "name"), name, nameCheck)
	dnsCheck(fe, field.NewPath("metadata", "namespace"), namespace, validation.IsDNS1123Label)
}

// validatePortNumber checks a 1-65535 port.
func validatePortNumber(fe *fieldErrors, path *field.Path, port int32) {
	if port < 1 || port > 65535 {
		fe.add(path, "%d is out of range 1-65535", port)
	}
}

// validateProtocol accepts Kubernetes' protocols. SCTP is valid input that
// the userspace proxy cannot carry: such a port is skipped and logged (see
// sctpPorts), as from the API server, and the object's other ports serve.
func validateProtocol(fe *fieldErrors, path *field.Path, p v1.Protocol) {
	switch p {
	case v1.ProtocolTCP, v1.ProtocolUDP, v1.ProtocolSCTP:
	default:
		fe.add(path, "%q is not a valid protocol (TCP, UDP or SCTP)", p)
	}
}

// parseIP accepts an IPv4 or IPv6 address without zone; ok is false otherwise.
func parseIP(s string) (netip.Addr, bool) {
	a, err := netip.ParseAddr(s)
	if err != nil || a.Zone() != "" {
		return netip.Addr{}, false
	}
	return a, true
}

func validateIP(fe *fieldErrors, path *field.Path, s string) (netip.Addr, bool) {
	a, ok := parseIP(s)
	if ok {
		return a, true
	}
	if a, ok = ParseObjectIP(s); ok {
		// Refused only by strict IP validation: an object an older API
		// server stored keeps it, and the informers serve it (read as
		// kube-proxy reads it), so a state file keeps it too.
		fe.addStrict(path, "%q has leading zeros (write %s)", s, a)
		return a, true
	}
	fe.add(path, "%q is not a valid IP address", s)
	return a, false
}

// validateUnmappedIP is validateIP that also refuses an IPv4-mapped IPv6
// address (::ffff:10.0.0.1), as the API server does (strict IP validation,
// on by default since Kubernetes 1.36): served, it was IPv4 to the proxy
// and IPv6 to whatever else reads the object.
func validateUnmappedIP(fe *fieldErrors, path *field.Path, s string) (netip.Addr, bool) {
	a, ok := validateIP(fe, path, s)
	if ok && a.Is4In6() {
		fe.addStrict(path, "%q is an IPv4-mapped IPv6 address (write %s)", s, a.Unmap())
		return netip.Addr{}, false
	}
	return a, ok
}

// portNames checks the names of a list of ports: DNS labels, unique, and
// required when the list has more than one port (owner says whose list).
type portNames struct {
	owner string
	many  bool
	seen  map[string]bool
}

func newPortNames(owner string, count int) *portNames {
	return &portNames{owner: owner, many: count > 1, seen: map[string]bool{}}
}

func (n *portNames) check(fe *fieldErrors, path *field.Path, name string) {
	if n.many && name == "" {
		fe.add(path, "is required when a %s has more than one port", n.owner)
	}
	if name == "" {
		return
	}
	dnsCheck(fe, path, name, validation.IsDNS1123Label)
	if n.seen[name] {
		fe.add(path, "%q is used by another port", name)
	}
	n.seen[name] = true
}
