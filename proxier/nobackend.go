package proxier

import (
	"errors"
	"net/netip"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/loadbalancer"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/relay"
)

// noBackendLogEvery bounds the -v=0 "no endpoint" lines per service port:
// a newcomer must see why a client was reset, but a Service without
// endpoints under load must not flood the log.
const noBackendLogEvery = 10 * time.Second

// noBackendLog says, at -v=0 and at most once per noBackendLogEvery, that
// a service port could reach no endpoint; the lines in between are counted
// and the count is reported with the next one.
type noBackendLog struct {
	last       atomic.Int64 // UnixNano of the last line
	suppressed atomic.Int64
}

// reserveRefusals is the log of clients refused because their socket fell
// in the descriptor reserve (relay.ErrDescriptorReserve): one for every
// service port, as the shortage is the process's, not a port's, and
// thousands of ports each saying so every 10 s would flood the log.
var reserveRefusals noBackendLog

// sessionLimitDrops is the log of UDP datagrams dropped at the total
// session cap: one for every service port, as the cap is the process's.
var sessionLimitDrops noBackendLog

func (l *noBackendLog) report(servicePort string, client netip.AddrPort, err error) {
	lines, msg := l, "No endpoint could be reached; the client was refused"
	switch {
	case errors.Is(err, loadbalancer.ErrNoEndpoints):
		// The usual cause is the manifests' (an EndpointSlice not
		// labelled for the Service, no endpoint ready): name it, and the
		// command that tells which.
		msg = "No endpoint to send the client to (no EndpointSlice labelled kubernetes.io/service-name for the Service, none ready under this port's name and protocol, or none on this node for a Local traffic policy: kube-userspace-proxy explain says which); the client was refused"
	case errors.Is(err, errHopLimitExceeded):
		msg = "UDP datagram dropped: its TTL ran out here"
	case err == errPortConnectionLimit:
		msg = "Clients refused: the service port holds --tcp-max-connections-per-port connections, its share of the open-file limit, which keeps the rest for other Services"
	case errors.Is(err, errPortSessionLimit):
		msg = "UDP datagrams of new clients dropped: the service port holds --udp-max-sessions-per-port sessions, and a fault (latency, reorder) still delays a client datagram of each of its oldest, which would be lost with its session"
	case errors.Is(err, errSessionLimit):
		lines, msg = &sessionLimitDrops, "UDP datagrams of new clients dropped: the proxy holds every UDP session it may (--udp-max-sessions, held to half the open-file limit and half the ephemeral ports), and neither this service port nor those holding the most has an idle one to close for them (a fault still delays a client datagram of each of their oldest); the count is of all service ports"
	case errors.Is(err, relay.ErrDescriptorReserve):
		lines, msg = &reserveRefusals, "Clients refused: connections hold every descriptor not kept back for the proxy's own use; the count is of all service ports"
	case errors.Is(err, unix.EADDRNOTAVAIL):
		// connect's EADDRNOTAVAIL: no local port left, or no usable
		// source address of the endpoint's family (the node's IPv6
		// disabled, its address still tentative); a leak of descriptors
		// it is not.
		msg = "No socket to dial an endpoint (this node is out of local ports, or no source address of the endpoint's IP family is usable: IPv6 disabled, an address still tentative); the client was refused"
	case relay.LocalShortage(err):
		msg = "No socket to dial an endpoint (this node is out of descriptors or ports); the client was refused"
	}
	suppressed, due := lines.due()
	if !due {
		klog.V(3).InfoS("No endpoint could be reached", "servicePort", servicePort, "client", client, "err", err)
		return
	}
	klog.InfoS(msg, "servicePort", servicePort, "client", client, "err", err, "alsoSinceLastReport", suppressed)
}

// endpointsTriedError is the last dial error of a client refused after its
// attempts failed, with the endpoints those attempts went to. The event
// loops' error is a bare errno and the goroutines' names the last endpoint
// only, so a Service whose backends were not up (a newcomer's first run)
// was logged as `err="connection refused"`, with no address to check.
type endpointsTriedError struct {
	err   error
	tried []netip.AddrPort // distinct, in the order tried
}

func (e *endpointsTriedError) Error() string {
	var b strings.Builder
	b.WriteString(e.err.Error())
	b.WriteString(" (endpoints tried: ")
	for i, ep := range e.tried {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(ep.String())
	}
	b.WriteString(")")
	return b.String()
}

func (e *endpointsTriedError) Unwrap() error { return e.err }

// withEndpointsTried is err with the distinct endpoints of tried (which it
// copies: a dial's attempts live in a reused array), or err itself when no
// endpoint was tried. Only on a refusal, off the path of a served client.
func withEndpointsTried(err error, tried []netip.AddrPort) error {
	if err == nil || len(tried) == 0 {
		return err
	}
	distinct := make([]netip.AddrPort, 0, len(tried))
	for _, ep := range tried {
		if !slices.Contains(distinct, ep) {
			distinct = append(distinct, ep)
		}
	}
	return &endpointsTriedError{err: err, tried: distinct}
}

// due takes the next -v=0 line if noBackendLogEvery has passed since the
// last, with the count of those suppressed meanwhile; else it counts one
// more suppressed.
func (l *noBackendLog) due() (suppressed int64, ok bool) {
	now := time.Now().UnixNano()
	last := l.last.Load()
	if now-last < int64(noBackendLogEvery) || !l.last.CompareAndSwap(last, now) {
		l.suppressed.Add(1)
		return 0, false
	}
	return l.suppressed.Swap(0), true
}
