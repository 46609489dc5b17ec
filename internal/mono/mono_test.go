package mono

import (
	"math"
	"testing"
	"time"
)

// A sum that fits is exact; one that does not stays at the end it was
// heading for (a plain sum wrapped: 1h after 47 minutes of uptime plus
// the largest duration was a time before the clock's start).
func TestAdd(t *testing.T) {
	const never = time.Duration(math.MaxInt64)
	for _, c := range []struct {
		t    int64
		d    time.Duration
		want int64
	}{
		{0, time.Second, int64(time.Second)},
		{int64(time.Hour), -time.Minute, int64(59 * time.Minute)},
		{int64(47 * time.Minute), 0, int64(47 * time.Minute)},
		{0, never, math.MaxInt64},
		{1, never, math.MaxInt64},
		{int64(47 * time.Minute), never, math.MaxInt64},
		{math.MaxInt64, 1, math.MaxInt64},
		{math.MaxInt64 - 1, 1, math.MaxInt64},
		{-1, time.Duration(math.MinInt64), math.MinInt64},
		{math.MinInt64, -1, math.MinInt64},
	} {
		if got := Add(c.t, c.d); got != c.want {
			t.Errorf("Add(%d, %d) = %d, want %d", c.t, int64(c.d), got, c.want)
		}
	}
}
