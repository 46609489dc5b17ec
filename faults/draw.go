package faults

import "math/rand/v2"

// Draws are pure functions of (seed, toxic, service port, sequence number,
// purpose), so a run with the same seed and the same arrival order gets the
// same faults, and a toxic added or changed never re-draws what another
// toxic decided (Toxiproxy's #603).

// Salts separate the independent draws made for one sequence number.
const (
	saltToxicity uint64 = iota
	saltEffect
	saltStream // seeds a connection's own generator (jitter, slice sizes)
)

func splitmix64(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// keyOf hashes a toxic's name and its port (FNV-1a), once per snapshot.
func keyOf(toxic, port string) uint64 {
	h := uint64(14695981039346656037)
	for _, s := range []string{toxic, "\x00", port} {
		for i := 0; i < len(s); i++ {
			h ^= uint64(s[i])
			h *= 1099511628211
		}
	}
	return h
}

// draw returns a number in [0, 1).
func draw(seed, key, seq, salt uint64) float64 {
	x := splitmix64(seed ^ splitmix64(key^splitmix64(seq^splitmix64(salt))))
	return float64(x>>11) * (1.0 / (1 << 53))
}

// streamRand is one toxic's generator on one connection, for its per-chunk
// choices (latency's jitter, slicer's sizes).
func streamRand(seed, key, seq uint64) *rand.Rand {
	s := splitmix64(seed ^ splitmix64(key^splitmix64(seq^splitmix64(saltStream))))
	return rand.New(rand.NewPCG(s, key))
}
