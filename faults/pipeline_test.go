package faults

import (
	"errors"
	"io"
	"syscall"
	"testing"
	"time"
)

// A stream's timers (reset_peer, timeout) fire on time whatever else the
// stream is doing: the earliest wins, and a chunk held back by bandwidth,
// latency or a slow close does not postpone them.
func TestPipelineTimersFireOnTime(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		toxics []string
		// backend: what the backend does once connected.
		backend func(b io.WriteCloser)
		reset   bool // else a FIN
		after   time.Duration
	}{
		{
			name:    "reset_peer before timeout",
			toxics:  []string{`{"type":"reset_peer","attributes":{"timeout":200}}`, `{"type":"timeout","attributes":{"timeout":500}}`},
			backend: func(io.WriteCloser) {},
			reset:   true, after: 200 * time.Millisecond,
		},
		{
			name:    "timeout before reset_peer",
			toxics:  []string{`{"type":"reset_peer","attributes":{"timeout":500}}`, `{"type":"timeout","attributes":{"timeout":200}}`},
			backend: func(io.WriteCloser) {},
			reset:   false, after: 200 * time.Millisecond,
		},
		{
			name:    "reset_peer during bandwidth",
			toxics:  []string{`{"type":"bandwidth","attributes":{"rate":1}}`, `{"type":"reset_peer","attributes":{"timeout":200}}`},
			backend: func(b io.WriteCloser) { b.Write(make([]byte, 10_000)) }, // 10 s at 1 KB/s
			reset:   true, after: 200 * time.Millisecond,
		},
		{
			name:    "reset_peer during latency",
			toxics:  []string{`{"type":"latency","attributes":{"latency":2000}}`, `{"type":"reset_peer","attributes":{"timeout":200}}`},
			backend: func(b io.WriteCloser) { b.Write([]byte("late")) },
			reset:   true, after: 200 * time.Millisecond,
		},
		{
			name:    "reset_peer during slow_close",
			toxics:  []string{`{"type":"slow_close","attributes":{"delay":2000}}`, `{"type":"reset_peer","attributes":{"timeout":200}}`},
			backend: func(b io.WriteCloser) { b.Close() },
			reset:   true, after: 200 * time.Millisecond,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, p := declared(t, 0, 0, "TCP", tc.toxics...)
			start := time.Now()
			client, backend, done := proxied(t, p, client1)
			tc.backend(backend)
			client.SetReadDeadline(time.Now().Add(5 * time.Second))
			_, err := io.Copy(io.Discard, client)
			took := time.Since(start)
			select {
			case <-done:
			case <-time.After(5 * time.Second):
				t.Error("the relay did not end")
			}
			if gotReset := errors.Is(err, syscall.ECONNRESET); gotReset != tc.reset || (!tc.reset && err != nil) {
				t.Fatalf("client read ended with %v after %v; want reset %v", err, took, tc.reset)
			}
			t.Logf("ended after %v (reset %v)", took.Round(time.Millisecond), tc.reset)
			if took < tc.after-30*time.Millisecond || took > tc.after+30*time.Millisecond {
				t.Fatalf("ended after %v, want %v ± 30 ms", took, tc.after)
			}
		})
	}
}
