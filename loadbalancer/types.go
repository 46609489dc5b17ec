// Package loadbalancer owns, per service port, the endpoints that may receive
// traffic, the round-robin cursor and the ClientIP affinity table. It talks to
// nothing but a clock, so every timing rule is testable with a fake clock.
package loadbalancer

import (
	"errors"
	"net/netip"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// ServicePortName names one port of one Service, as kube-proxy does.
type ServicePortName struct {
	types.NamespacedName
	Port     string // the port's name; may be empty for single-port Services
	Protocol v1.Protocol
}

// String renders "ns/name:port" (":port" omitted when the port has no name),
// the form used in iptables comments and logs.
func (s ServicePortName) String() string {
	if s.Port == "" {
		return s.NamespacedName.String()
	}
	return s.Namespace + "/" + s.Name + ":" + s.Port
}

// Endpoint is one backend of a service port, with the EndpointSlice
// conditions that decide whether it may get new traffic.
type Endpoint struct {
	Addr        netip.AddrPort
	Ready       bool
	Serving     bool
	Terminating bool
	NodeName    string
	Zone        string
	// ZoneHints and NodeHints are the EndpointSlice topology hints (forZones,
	// forNodes); the proxier filters on them before the balancer sees the list.
	ZoneHints []string
	NodeHints []string
}

// AffinityPolicy is a service port's sessionAffinity.
type AffinityPolicy struct {
	ClientIP bool
	Timeout  time.Duration // meaningful when ClientIP; default 10800 s
}

// DefaultAffinityTimeout is the Kubernetes default for sessionAffinityConfig.clientIP.timeoutSeconds.
const DefaultAffinityTimeout = 10800 * time.Second

// ErrNoEndpoints is returned by Next when the service port has no usable endpoint.
var ErrNoEndpoints = errors.New("no endpoints available")

// AffinityEntry is one row of a service port's affinity table, for debugging output.
type AffinityEntry struct {
	ClientIP netip.Addr
	Endpoint netip.AddrPort
	LastUsed time.Time
}

// Snapshot is a copy of one service port's balancer state, for /debug/services.
type Snapshot struct {
	Endpoints []netip.AddrPort // in round-robin order, only those eligible for traffic
	Affinity  AffinityPolicy
	Clients   []AffinityEntry
	Evicted   uint64 // clients the table's cap pushed out, since the port appeared
}

// AffinityStats is the size of one service port's affinity table and how
// many clients its cap evicted, for metrics.
type AffinityStats struct {
	ClientIP bool // the port has ClientIP affinity now
	Entries  int
	Evicted  uint64
}

// Limits bound what the outside can make the balancer hold.
type Limits struct {
	// MaxAffinityEntries caps each service port's ClientIP affinity table;
	// a new client of a full table evicts the least recently used one.
	// 0 means no cap.
	MaxAffinityEntries int
}
