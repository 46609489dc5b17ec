package config

import (
	"fmt"
	"slices"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
)

// sctpPorts lists svc's SCTP ports ("name 5000/SCTP") that old (nil: none)
// did not list. SCTP is valid Kubernetes, but a userspace proxy has no
// socket for it: the Service is served on its TCP and UDP ports and the
// SCTP ones are skipped, by both sources alike, with a word once per
// Service change that brings one (not on every resync).
func sctpPorts(old, svc *v1.Service) []string {
	var had []string
	if old != nil {
		had = sctpPortsOf(old)
	}
	var out []string
	for _, p := range sctpPortsOf(svc) {
		if !slices.Contains(had, p) {
			out = append(out, p)
		}
	}
	return out
}

// SCTPPorts lists svc's SCTP ports ("name 5000/SCTP"), which every
// source skips.
func SCTPPorts(svc *v1.Service) []string { return sctpPortsOf(svc) }

func sctpPortsOf(svc *v1.Service) []string {
	var out []string
	for _, p := range svc.Spec.Ports {
		if p.Protocol == v1.ProtocolSCTP {
			out = append(out, fmt.Sprintf("%s %d/SCTP", portName(p.Name), p.Port))
		}
	}
	return out
}

func portName(name string) string {
	if name == "" {
		return `""`
	}
	return name
}

// logSCTPPorts says which ports of svc are skipped as SCTP, when a change
// brings one.
func logSCTPPorts(old, svc *v1.Service) {
	if ports := sctpPorts(old, svc); len(ports) > 0 {
		msg := "Warning: SCTP ports are skipped (the userspace proxy carries TCP and UDP); the Service's other ports are served"
		if len(sctpPortsOf(svc)) == len(svc.Spec.Ports) {
			// "its other ports are served" said there were some.
			msg = "Warning: SCTP ports are skipped (the userspace proxy carries TCP and UDP); the Service has no other port, so it is not served"
		}
		klog.InfoS(msg, "service", klog.KObj(svc), "ports", ports)
	}
}
