package faults

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"syscall"
	"testing"
	"time"
)

// reset_peer behaves as Toxiproxy's (toxics/reset_peer.go, and its
// reset_peer_test.go is this test's shape): the first chunk on its stream
// starts the clock and is dropped with everything after it, and timeout ms
// later both sides are reset. So a client that sends a request gets a reset,
// never the answer, whatever the timeout; before, the clock ran from the
// connection's start and let the request and its answer through until then.
func TestResetPeerAsToxiproxy(t *testing.T) {
	t.Parallel()
	const msg = "reset toxic payload\n"
	for _, stream := range []string{"upstream", "downstream"} {
		for _, timeout := range []int{0, 100} {
			t.Run(fmt.Sprintf("%s/timeout=%d", stream, timeout), func(t *testing.T) {
				t.Parallel()
				_, p := declared(t, 0, 0, "TCP", fmt.Sprintf(`{"type":"reset_peer","stream":%q,"attributes":{"timeout":%d}}`, stream, timeout))
				client, backend, done := proxied(t, p, client1)
				// The backend answers a line with the same line, as
				// Toxiproxy's test server does.
				backendGot := make(chan bool, 1)
				go func() {
					backend.SetReadDeadline(time.Now().Add(5 * time.Second))
					got := bufio.NewScanner(backend).Scan()
					backendGot <- got
					if got {
						backend.Write([]byte(msg))
					}
				}()
				start := time.Now()
				if _, err := client.Write([]byte(msg)); err != nil {
					t.Fatal(err)
				}
				client.SetReadDeadline(time.Now().Add(5 * time.Second))
				buf := make([]byte, 100)
				n, err := client.Read(buf)
				took := time.Since(start)
				if !errors.Is(err, syscall.ECONNRESET) {
					t.Fatalf("client read %q, %v after %v; want a reset", buf[:n], err, took)
				}
				if want := time.Duration(timeout) * time.Millisecond; took < want-10*time.Millisecond || took > want+time.Second {
					t.Errorf("reset after %v; want about %v", took, want)
				}
				// Upstream, the request was the chunk the toxic dropped;
				// downstream it reached the backend, whose answer was.
				if got := <-backendGot; got != (stream == "downstream") {
					t.Errorf("backend received the request: %v; want %v", got, stream == "downstream")
				}
				relayEnds(t, done)
			})
		}
	}
}

// Until bytes come on its stream, reset_peer does nothing: a connection
// whose client has not spoken yet is served both ways (Toxiproxy's toxic
// waits for its first chunk; an idle connection is never reset there).
func TestResetPeerWaitsForItsStream(t *testing.T) {
	t.Parallel()
	_, p := declared(t, 0, 0, "TCP", `{"type":"reset_peer","stream":"upstream","attributes":{"timeout":0}}`)
	client, backend, done := proxied(t, p, client1)
	time.Sleep(100 * time.Millisecond)
	// The other stream flows: a server that speaks first is heard.
	if _, err := backend.Write([]byte("banner")); err != nil {
		t.Fatal(err)
	}
	client.SetReadDeadline(time.Now().Add(5 * time.Second))
	got := make([]byte, 6)
	if _, err := io.ReadFull(client, got); err != nil || string(got) != "banner" {
		t.Fatalf("client read %q, %v; want the banner", got, err)
	}
	if _, err := client.Write([]byte("hello")); err != nil {
		t.Fatal(err)
	}
	if _, err := client.Read(got); !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("client read after its first bytes: %v; want a reset", err)
	}
	backend.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := backend.Read(got); !isResetOrEOF(err) {
		t.Fatalf("backend read %q, %v; want the connection ended without the client's bytes", got[:n], err)
	}
	relayEnds(t, done)
}

func isResetOrEOF(err error) bool {
	return errors.Is(err, syscall.ECONNRESET) || errors.Is(err, io.EOF)
}

// Of two reset_peer toxics on a stream the shorter timeout resets (README:
// "of two reset_peer the shorter timeout"), whichever is listed first.
// Found by mutation: keeping the longer passed every test.
func TestResetPeerShorterOfTwo(t *testing.T) {
	t.Parallel()
	for _, order := range [][2]string{{"0", "60000"}, {"60000", "0"}} {
		t.Run(order[0]+" then "+order[1], func(t *testing.T) {
			t.Parallel()
			_, p := declared(t, 0, 0, "TCP",
				`{"name":"a","type":"reset_peer","stream":"upstream","attributes":{"timeout":`+order[0]+`}}`,
				`{"name":"b","type":"reset_peer","stream":"upstream","attributes":{"timeout":`+order[1]+`}}`)
			client, _, done := proxied(t, p, client1)
			if _, err := client.Write([]byte("x")); err != nil {
				t.Fatal(err)
			}
			client.SetReadDeadline(time.Now().Add(5 * time.Second))
			if _, err := client.Read(make([]byte, 1)); !errors.Is(err, syscall.ECONNRESET) {
				t.Fatalf("client read ended with %v; want the reset of the 0 ms toxic, at once", err)
			}
			relayEnds(t, done)
		})
	}
}
