// Package mono owns the process's monotonic clock kept as int64
// nanoseconds (Now, Time: the UDP sessions', the splice pipe pool's), and
// Add, the one way due times are computed on such clocks (the event
// loop's too): a duration flag may be as large as a time.Duration goes
// (2562047h, a natural way to say "never"), and a plain sum then wraps
// into the past, so the bound it sets runs out at once.
package mono

import (
	"math"
	"time"
)

// Add is t+d, saturating at the ends of int64 instead of wrapping: a due
// time too far off to represent is the farthest one, never a past one.
func Add(t int64, d time.Duration) int64 {
	switch {
	case d > 0 && t > math.MaxInt64-int64(d):
		return math.MaxInt64
	case d < 0 && t < math.MinInt64-int64(d):
		return math.MinInt64
	}
	return t + int64(d)
}

// epoch anchors Now: times on it are monotonic, so a wall-clock step never
// expires every deadline at once or keeps them forever.
var epoch = time.Now()

// Now is the time on the process's monotonic clock.
func Now() int64 { return int64(time.Since(epoch)) }

// Time is t, a time on Now's clock, as a time.Time.
func Time(t int64) time.Time { return epoch.Add(time.Duration(t)) }
