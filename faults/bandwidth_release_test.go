package faults

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"testing"
	"time"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/relay"
)

// Removing the bandwidth 0 toxics that hold a connection lets what they
// hold flow on, as Toxiproxy's removal does (its BandwidthToxic, on the
// interrupt, writes the chunk it holds on): Testcontainers' cut and
// restore, `bandwidth` 0 on both streams then removed, with a client that
// connected while the cut was in force. Kept with the toxics it drew, such
// a connection stayed held for ever after the restore: the request never
// reached the backend. Only the removal reaches live connections, as a
// timeout's does; a change of the rate reaches new connections only, and a
// stream still held by another bandwidth 0 stays held.
func TestRemovedBandwidthZeroReleasesWhatItHolds(t *testing.T) {
	const (
		cutDown = `{"name":"CUT_DOWN","type":"bandwidth","stream":"downstream","attributes":{"rate":0}}`
		cutUp   = `{"name":"CUT_UP","type":"bandwidth","stream":"upstream","attributes":{"rate":0}}`
	)
	for _, tc := range []struct {
		name string
		// via: "api" (added through the API, then removed by restore),
		// "annotation" (declared, then the annotation without them).
		via     string
		restore func(t *testing.T, tbl *Table, p *Port)
		flows   bool
	}{
		{"deleted", "api", func(t *testing.T, tbl *Table, p *Port) {
			for _, name := range []string{"CUT_DOWN", "CUT_UP"} {
				if err := tbl.RemoveToxic(p.Name(), name); err != nil {
					t.Fatal(err)
				}
			}
		}, true},
		{"reset", "api", func(t *testing.T, tbl *Table, p *Port) { tbl.Reset() }, true},
		{"annotation", "annotation", func(t *testing.T, tbl *Table, p *Port) { p.SetDeclared(nil) }, true},
		{"rate changed", "api", func(t *testing.T, tbl *Table, p *Port) {
			for _, name := range []string{"CUT_DOWN", "CUT_UP"} {
				if _, err := tbl.UpdateToxic(p.Name(), name, []byte(`{"attributes":{"rate":1000}}`)); err != nil {
					t.Fatal(err)
				}
			}
		}, false},
	} {
		for _, track := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/tracked=%v", tc.name, track), func(t *testing.T) {
				var tbl *Table
				var p *Port
				if tc.via == "annotation" {
					tbl, p = declared(t, 0, 0, "TCP", cutDown, cutUp)
				} else {
					tbl, p = declared(t, 0, 0, "TCP")
					for _, js := range []string{cutDown, cutUp} {
						if _, err := tbl.AddToxic(p.Name(), toxic(t, js)); err != nil {
							t.Fatal(err)
						}
					}
				}
				tbl.TrackLive = track
				client, backend, done := proxied(t, p, client1)
				if _, err := client.Write([]byte("ping")); err != nil {
					t.Fatal(err)
				}
				expectHeld(t, backend, "the request under the cut")
				tc.restore(t, tbl, p)
				if !tc.flows {
					expectHeld(t, backend, "the request after the restore")
					// Reset by both peers: a hold without a half-close
					// bound outlasts their FINs (as Toxiproxy's).
					resetClose(t, client, backend)
					relayEnds(t, done)
					return
				}
				expectRead(t, backend, "ping", "the backend, once the cut was removed")
				if _, err := backend.Write([]byte("pong")); err != nil {
					t.Fatal(err)
				}
				expectRead(t, client, "pong", "the client, once the cut was removed")
				client.Close()
				expectEOF(t, backend)
				backend.Close()
				relayEnds(t, done)
			})
		}
	}

	t.Run("one of two holding the stream removed", func(t *testing.T) {
		tbl, p := declared(t, 0, 0, "TCP")
		for _, js := range []string{cutUp, `{"name":"ALSO_UP","type":"bandwidth","stream":"upstream","attributes":{"rate":0}}`} {
			if _, err := tbl.AddToxic(p.Name(), toxic(t, js)); err != nil {
				t.Fatal(err)
			}
		}
		client, backend, done := proxied(t, p, client1)
		if _, err := client.Write([]byte("ping")); err != nil {
			t.Fatal(err)
		}
		if err := tbl.RemoveToxic(p.Name(), "CUT_UP"); err != nil {
			t.Fatal(err)
		}
		expectHeld(t, backend, "the request while another bandwidth 0 holds the stream")
		if err := tbl.RemoveToxic(p.Name(), "ALSO_UP"); err != nil {
			t.Fatal(err)
		}
		expectRead(t, backend, "ping", "the backend, once both were removed")
		client.Close()
		backend.Close()
		relayEnds(t, done)
	})
}

// A held stream whose client closed during the cut (the hold then waits
// --tcp-half-close-timeout before it resets both peers) is released by the
// removal too: the request, then the client's FIN, reach the backend.
func TestRemovedBandwidthZeroReleasesAStreamWhoseSourceEnded(t *testing.T) {
	tbl, p := declared(t, 0, 0, "TCP")
	if _, err := tbl.AddToxic(p.Name(), toxic(t, `{"name":"cut","type":"bandwidth","stream":"upstream","attributes":{"rate":0}}`)); err != nil {
		t.Fatal(err)
	}
	client, backend, done := proxiedWith(t, p, client1, relay.Options{HalfCloseTimeout: time.Minute})
	if _, err := client.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	if err := client.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	expectHeld(t, backend, "the request under the cut")
	// The hold looks at its source every second, and once it has seen the
	// FIN it waits out the half-close bound: the removal ends either wait.
	if err := tbl.RemoveToxic(p.Name(), "cut"); err != nil {
		t.Fatal(err)
	}
	expectRead(t, backend, "ping", "the backend, once the cut was removed")
	expectEOF(t, backend)
	backend.Close()
	relayEnds(t, done)
}

// A connection accepted under the cut and attached (its backend dialled)
// after the cut was removed is released too: the removal's look at the
// live connections did not see it yet.
func TestBandwidthZeroRemovedBeforeAttachReleases(t *testing.T) {
	tbl, p := declared(t, 0, 0, "TCP")
	if _, err := tbl.AddToxic(p.Name(), toxic(t, `{"name":"cut","type":"bandwidth","stream":"upstream","attributes":{"rate":0}}`)); err != nil {
		t.Fatal(err)
	}
	remove := func(_, _ *net.TCPConn) {
		if err := tbl.RemoveToxic(p.Name(), "cut"); err != nil {
			t.Fatal(err)
		}
	}
	client, backend, done := proxiedWith(t, p, client1, relay.Options{}, remove)
	if _, err := client.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	expectRead(t, backend, "ping", "the backend of a connection attached after the cut was removed")
	client.Close()
	backend.Close()
	relayEnds(t, done)
}

// expectHeld fails unless nothing arrives on c for 300 ms.
func expectHeld(t *testing.T, c *net.TCPConn, what string) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	if n, err := c.Read(make([]byte, 64)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("%s: read %d bytes, %v; want it held", what, n, err)
	}
}

// expectRead fails unless want arrives on c within 3 s.
func expectRead(t *testing.T, c *net.TCPConn, want, who string) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(3 * time.Second))
	got := make([]byte, len(want))
	if n, err := io.ReadFull(c, got); err != nil || string(got) != want {
		t.Fatalf("%s read %q (%d bytes), %v; want %q", who, got[:n], n, err, want)
	}
}

// expectEOF fails unless c reads its peer's FIN within 3 s.
func expectEOF(t *testing.T, c *net.TCPConn) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(3 * time.Second))
	if n, err := c.Read(make([]byte, 64)); n != 0 || err != io.EOF {
		t.Fatalf("read %d bytes, %v; want the FIN", n, err)
	}
}

// resetClose closes each of conns with a reset (SO_LINGER 0).
func resetClose(t *testing.T, conns ...*net.TCPConn) {
	t.Helper()
	for _, c := range conns {
		if err := c.SetLinger(0); err != nil {
			t.Fatal(err)
		}
		c.Close()
	}
}
