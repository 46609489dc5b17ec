package config

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// claim is something only one Service may hold: a clusterIP or a node port.
// The API server refuses a second Service that names one another Service
// holds; manifests have no API server, so two files could both name it and
// both were served (two Services on one portal, the second NodePort socket
// failing to open).
type claim struct {
	what string // "clusterIP 10.96.0.10", "nodePort 30080": what must be unique
	path string // where the Service names it: spec.clusterIP, spec.ports[1].nodePort
}

// serviceClaims lists a Service's claims once each: its cluster IPs (not
// "None"), and its node ports (a port may list one node port for TCP and for
// UDP, as the API server allows) and healthCheckNodePort.
func serviceClaims(svc *v1.Service) []claim {
	var out []claim
	seen := map[string]bool{}
	add := func(what string, path *field.Path) {
		if !seen[what] {
			seen[what] = true
			out = append(out, claim{what, path.String()})
		}
	}
	spec := field.NewPath("spec")
	for i, ip := range svc.Spec.ClusterIPs {
		if a, err := netip.ParseAddr(ip); err == nil {
			path := spec.Child("clusterIPs").Index(i)
			if i == 0 {
				path = spec.Child("clusterIP")
			}
			add("clusterIP "+a.Unmap().String(), path)
		}
	}
	for i, p := range svc.Spec.Ports {
		if p.NodePort != 0 {
			add("nodePort "+strconv.Itoa(int(p.NodePort)), spec.Child("ports").Index(i).Child("nodePort"))
		}
	}
	if svc.Spec.HealthCheckNodePort != 0 {
		add("nodePort "+strconv.Itoa(int(svc.Spec.HealthCheckNodePort)), spec.Child("healthCheckNodePort"))
	}
	return out
}

// claimsOf is the claims of a delivered object; none for a slice.
func claimsOf(o servedObject) []claim {
	if svc, ok := o.obj.(*v1.Service); ok {
		return serviceClaims(svc)
	}
	return nil
}

// resolveClaims leaves out of desired every Service that claims what another
// Service holds, with an error naming both, as the API server would refuse
// it. A Service keeps its last good version (the one being served) when that
// one claims nothing taken; a new one is left out. Who holds a claim: the
// Service that is served with it and still names it, else the first in file
// order (files sorted by name, then documents in order), so a file that
// sorts first cannot take an address from a Service already serving it.
func resolveClaims(desired, served map[objectKey]servedObject) []error {
	owner := map[string]objectKey{}
	for k, o := range desired {
		prev, ok := served[k]
		if !ok {
			continue
		}
		held := map[string]bool{}
		for _, c := range claimsOf(prev) {
			held[c.what] = true
		}
		for _, c := range claimsOf(o) {
			if held[c.what] {
				owner[c.what] = k
			}
		}
	}
	keys := make([]objectKey, 0, len(desired))
	for k, o := range desired {
		if _, ok := o.obj.(*v1.Service); ok {
			keys = append(keys, k)
		}
	}
	slices.SortFunc(keys, func(a, b objectKey) int {
		oa, ob := desired[a], desired[b]
		return cmp.Or(cmp.Compare(oa.file, ob.file), cmp.Compare(oa.doc, ob.doc), cmp.Compare(a.String(), b.String()))
	})
	var errs []error
	for _, k := range keys {
		o := desired[k]
		c, holder := clash(claimsOf(o), owner, k)
		if holder == nil {
			take(claimsOf(o), owner, k)
			continue
		}
		h := desired[*holder]
		msg := fmt.Sprintf("%s: %s is already used by %s (%s document %d)", c.path, c.what, holder, h.file, h.doc)
		if h.allocated && strings.HasPrefix(c.what, "clusterIP ") {
			msg += ", allocated to it from --service-cluster-ip-range"
		}
		prev, had := served[k]
		if _, again := clash(claimsOf(prev), owner, k); had && again == nil && !equality.Semantic.DeepEqual(prev.obj, o.obj) {
			take(claimsOf(prev), owner, k)
			desired[k] = prev
			msg += "; keeping its last good version"
		} else {
			delete(desired, k)
			for w, by := range owner {
				if by == k {
					delete(owner, w) // reserved for it above, free now
				}
			}
		}
		errs = append(errs, &ManifestError{File: o.file, Doc: o.doc, Kind: k.Kind, Namespace: k.Namespace, Name: k.Name, Err: fmt.Errorf("%s", msg)})
	}
	return errs
}

// clash returns the first of cs held by a Service other than k, and that
// Service; holder is nil when there is none.
func clash(cs []claim, owner map[string]objectKey, k objectKey) (c claim, holder *objectKey) {
	for _, c := range cs {
		if by, ok := owner[c.what]; ok && by != k {
			return c, &by
		}
	}
	return claim{}, nil
}

func take(cs []claim, owner map[string]objectKey, k objectKey) {
	for _, c := range cs {
		owner[c.what] = k
	}
}
