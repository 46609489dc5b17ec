package config

import (
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strings"
)

var defaultServiceClusterIPRange, _ = ParseServiceClusterIPRange(DefaultServiceClusterIPRange)

// summarize gives one line at start and one after each reload that changed
// something (objects, the files read or skipped, a file's errors), so that
// nothing the source does is silent:
//
//	examples/manifests: 3 Services, 3 EndpointSlices from 4 files; skipped README.md (not .yaml, .yml or .json)
//	app: 1 Service, 0 EndpointSlices from 1 file; 2 objects of other kinds skipped (ConfigMap, Deployment): see -v=2
//	examples/manifests: 2 Services, 2 EndpointSlices from 3 files; removed Service default/web, EndpointSlice default/web-1
//	legacy.yaml: 1 Service, 1 Endpoints from 1 file
func (s *ManifestSource) summarize(files int, skipped []skippedFile, events []event, recovered []string) {
	var bad []string
	for name, isBad := range s.badFiles {
		if isBad || s.lastReads[name] != "" {
			bad = append(bad, s.display(name))
		}
	}
	// A file that cannot be read (not a regular file, over the size cap,
	// permission denied) keeps its last good objects, if any, and is as
	// much in error as one that does not decode.
	for name := range s.lastReads {
		if _, known := s.badFiles[name]; !known {
			bad = append(bad, s.display(name))
		}
	}
	slices.Sort(bad)
	var skips []string
	for _, f := range skipped {
		skips = append(skips, fmt.Sprintf("%s (%s)", f.name, f.why))
	}
	others := s.otherKinds()
	shape := fmt.Sprint(files, skips, bad, others)
	if s.summarized && len(events) == 0 && len(recovered) == 0 && shape == s.lastShape {
		return
	}
	first := !s.summarized
	s.summarized, s.lastShape = true, shape

	// What the user wrote: a v1 Endpoints is counted and named as such,
	// not as the slices it is converted to (one per subset and family).
	services, slices := 0, 0
	endpoints := map[objectKey]bool{}
	for k, o := range s.served {
		switch {
		case k.Kind == KindService:
			services++
		case o.source.Kind == KindEndpoints:
			endpoints[o.source] = true
		default:
			slices++
		}
	}
	counts := []string{count(services, "Service")}
	if slices > 0 || len(endpoints) == 0 {
		counts = append(counts, count(slices, "EndpointSlice"))
	}
	if len(endpoints) > 0 {
		counts = append(counts, fmt.Sprintf("%d Endpoints", len(endpoints))) // the kind's plural too
	}
	parts := []string{fmt.Sprintf("%s from %s", strings.Join(counts, ", "), count(files, "file"))}
	if files == 0 && s.dirMode {
		parts[0] += " (no .yaml, .yml or .json file in the directory)"
	}
	if others != "" {
		parts = append(parts, others)
	}
	var added, updated, removed []string
	named := map[string]bool{}
	for _, e := range events {
		o := e.cur
		if o == nil {
			o = e.old
		}
		name := e.key().String()
		if o.source.Kind == KindEndpoints {
			name = o.source.String()
		}
		if named[name] { // another slice of the same Endpoints
			continue
		}
		named[name] = true
		switch {
		case e.old == nil:
			added = append(added, name)
		case e.cur == nil:
			removed = append(removed, name)
		default:
			updated = append(updated, name)
		}
	}
	list := func(verb string, names []string) {
		if len(names) == 0 {
			return
		}
		const shown = 4
		if len(names) > shown {
			names = append(names[:shown:shown], fmt.Sprintf("and %d more", len(names)-shown))
		}
		parts = append(parts, verb+" "+strings.Join(names, ", "))
	}
	if !first { // at start, everything is added: the counts say it
		list("added", added)
		list("updated", updated)
		list("removed", removed)
	}
	for i := range recovered {
		recovered[i] = s.display(recovered[i])
	}
	list("recovered", recovered)
	list("errors in", bad)
	list("skipped", skips)
	s.summary(s.path + ": " + strings.Join(parts, "; "))
}

// otherKinds says how many objects of kinds the proxy does not use the
// files hold, and of which kinds, or "": a directory of an app's manifests
// (a Deployment, a ConfigMap beside the Service) said nothing of them below
// -v=2, so a newcomer could not tell them skipped from lost.
func (s *ManifestSource) otherKinds() string {
	n := 0
	kinds := map[string]bool{}
	for name, f := range s.files {
		if _, gone := s.vanished[name]; gone {
			continue
		}
		n += len(f.otherKinds)
		for _, k := range f.otherKinds {
			kinds[k] = true
		}
	}
	if n == 0 {
		return ""
	}
	names := slices.Sorted(maps.Keys(kinds))
	const shown = 4
	if len(names) > shown {
		names = append(names[:shown:shown], fmt.Sprintf("and %d more", len(names)-shown))
	}
	noun := "objects of other kinds"
	if n == 1 {
		noun = "object of another kind"
	}
	return fmt.Sprintf("%d %s skipped (%s): see -v=2", n, noun, strings.Join(names, ", "))
}

// display names a file as the user knows it: relative to the directory.
func (s *ManifestSource) display(name string) string {
	if s.dirMode {
		if rel, err := filepath.Rel(s.path, name); err == nil {
			return rel
		}
	}
	return name
}

func count(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}
