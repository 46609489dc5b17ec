// Package mono owns Add, the one way due times are computed on the
// monotonic clocks kept as int64 nanoseconds (the event loop's, the UDP
// sessions'): a duration flag may be as large as a time.Duration goes
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
