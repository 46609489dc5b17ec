package soak

import (
	"math/rand/v2"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
)

// Endpoint limits per Service while churning: never empty, so every
// connection always has a live endpoint to go to.
const (
	minEndpoints = 1
	maxEndpoints = 5
)

// services is the churned endpoint state of every Service: which backends
// each one lists now, and how often each backend has been removed from it, so
// a connection cut mid-flight can be told apart from a failure (its endpoint
// was removed while it lived) and counted separately.
type services struct {
	dir      string
	backends []netip.Addr

	mu      sync.Mutex
	members [][]int // per Service, indexes into backends, sorted

	removals [][]atomic.Int64 // [service][backend]: times removed
	writes   atomic.Int64     // manifests rewritten by churn
}

func newServices(dir string, backends []netip.Addr, n int) (*services, error) {
	s := &services{dir: dir, backends: backends, members: make([][]int, n), removals: make([][]atomic.Int64, n)}
	for i := range n {
		s.removals[i] = make([]atomic.Int64, len(backends))
		s.members[i] = []int{i % len(backends), (i + 1) % len(backends), (i + 2) % len(backends)}
		slices.Sort(s.members[i])
		if err := s.write(i); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// write renders Service i's current members; s.mu is held or not needed.
func (s *services) write(i int) error {
	var eps []netip.Addr
	for _, b := range s.members[i] {
		eps = append(eps, s.backends[b])
	}
	return writeManifest(s.dir, i, eps)
}

// removed is how often backend b has left Service i so far.
func (s *services) removed(i, b int) int64 {
	if b < 0 || b >= len(s.backends) {
		return 0
	}
	return s.removals[i][b].Load()
}

// churn adds or removes one endpoint of Service i and rewrites its manifest.
// A removal is counted before the file changes, so a connection cut by it
// always sees the count move.
func (s *services) churn(i int, rng *rand.Rand) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := s.members[i]
	add := len(m) <= minEndpoints || (len(m) < maxEndpoints && rng.IntN(2) == 0)
	if add {
		var out []int
		for b := range s.backends {
			if !slices.Contains(m, b) {
				out = append(out, b)
			}
		}
		m = append(m, out[rng.IntN(len(out))])
		slices.Sort(m)
	} else {
		k := rng.IntN(len(m))
		s.removals[i][m[k]].Add(1)
		m = slices.Delete(slices.Clone(m), k, k+1)
	}
	s.members[i] = m
	s.writes.Add(1)
	return s.write(i)
}
