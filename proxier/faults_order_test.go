package proxier

import (
	"io"
	"net"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/faults"
)

// A pool: connections opened back to back, each handshake done before the
// next starts (so the kernel's accept queue holds them in that order), and
// only then used. The connections refused must be those the draw function
// refuses for numbers 0..n-1 in that order, on either data path (the
// event loops several, racing on the shared listener); README: "the same
// seed and arrival order give the same faults".
func TestFaultDrawsFollowAcceptOrder(t *testing.T) {
	const (
		n          = 200
		seed       = 5
		annotation = `[{"name":"r","type":"refuse","toxicity":0.5}]`
	)
	svc := makeService("web", withFaults(annotation))
	want := refusedByDraws(t, seed, svc, n)
	for _, path := range DataPaths {
		t.Run(path, func(t *testing.T) {
			backend := serveTCP(t, "127.0.0.2", func(c net.Conn) {
				_, _ = c.Write([]byte("hi"))
				_, _ = c.Read(make([]byte, 1)) // until the client closes
			})
			// Loops enough to race on 2 cores.
			p := newTestProxier(t, Options{DataPath: path, EventLoops: 4, Faults: faults.NewTable(seed, 0, nil)})
			p.OnServiceAdd(svc)
			p.OnEndpointSliceAdd(makeSlice("web", v1.ProtocolTCP, backend.Addr().String()))
			p.Sync()
			addr := proxyAddr(t, p, "default/web:p")
			pool := make([]net.Conn, n)
			got := make([]bool, n)
			for i := range pool {
				c, err := net.DialTimeout("tcp", addr, 2*time.Second)
				switch {
				case isConnReset(err):
					// Refused before connect returned: the handshake was
					// done, so the next one is still queued behind it.
					got[i] = true
				case err != nil:
					t.Fatal(err)
				default:
					t.Cleanup(func() { c.Close() })
					pool[i] = c
				}
			}
			for i, c := range pool {
				if c == nil {
					continue
				}
				_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
				_, err := c.Read(make([]byte, 2))
				switch {
				case isConnReset(err):
					got[i] = true
				case err != nil:
					t.Fatalf("connection %d: %v, want a greeting or a reset", i, err)
				}
			}
			if diff := differing(got, want); len(diff) > 0 {
				t.Errorf("refused:   %s\ndraws say: %s\n%d of %d connections differ (first: %v)",
					pattern(got), pattern(want), len(diff), n, diff[:min(len(diff), 10)])
			}
		})
	}
}

// refusedByDraws is which of a port's first n connections svc's faults
// refuse, decided one at a time in order on a table of its own.
func refusedByDraws(t *testing.T, seed int64, svc *v1.Service, n int) []bool {
	t.Helper()
	toxics, err := faults.ForService(svc)
	if err != nil {
		t.Fatal(err)
	}
	port := faults.NewTable(seed, 0, nil).Port(faults.ProxyName("default", svc.Name, "p", 80), "TCP")
	port.SetDeclared(toxics["p"])
	out := make([]bool, n)
	for i := range out {
		if c := port.Accept(mustAddr("127.0.0.1")); c != nil {
			out[i] = c.Refuse
			c.Done()
		}
	}
	return out
}

func differing(a, b []bool) []int {
	var out []int
	for i := range a {
		if a[i] != b[i] {
			out = append(out, i)
		}
	}
	return out
}

func pattern(refused []bool) string {
	b := make([]byte, len(refused))
	for i, r := range refused {
		b[i] = '.'
		if r {
			b[i] = 'F'
		}
	}
	return string(b)
}

// --fault-max-active's slots go in accept order too: with a cap of k, the
// first k connections of a pool opened back to back are the faulted ones,
// on either data path. The goroutine path numbered each connection in its
// accept loop but drew its faults, and took its slot, in the connection's
// goroutine, which the scheduler starts in its own order: on the real
// binary, 6 connections under a cap of 2 faulted "F....F" in 2 rounds of 6.
// The faulted ones are told apart without timing: a timeout 0 toxic drops
// the greeting and holds them (and their slots) until it is removed, which
// ends them with a FIN; the others read the greeting. Each round has a
// proxier of its own, so that no slot is still held from the round before.
func TestFaultMaxActiveFollowsAcceptOrder(t *testing.T) {
	const rounds, n, limit = 4, 30, 10
	annotation := `[{"name":"hold","type":"timeout","attributes":{"timeout":0}}]`
	for _, path := range DataPaths {
		t.Run(path, func(t *testing.T) {
			backend := serveTCP(t, "127.0.0.2", func(c net.Conn) {
				_, _ = c.Write([]byte("hi"))
				_, _ = c.Read(make([]byte, 1)) // until the client closes
			})
			for round := range rounds {
				p := newTestProxier(t, Options{DataPath: path, EventLoops: 4, Faults: faults.NewTable(1, limit, nil)})
				svc := makeService("web", withFaults(annotation))
				p.OnServiceAdd(svc)
				p.OnEndpointSliceAdd(makeSlice("web", v1.ProtocolTCP, backend.Addr().String()))
				p.Sync()
				addr := proxyAddr(t, p, "default/web:p")
				pool := make([]net.Conn, n)
				for i := range pool {
					c, err := net.DialTimeout("tcp", addr, 2*time.Second)
					if err != nil {
						t.Fatal(err)
					}
					t.Cleanup(func() { c.Close() })
					pool[i] = c
				}
				// The unfaulted read their greeting while the faulted
				// are held; then the toxic goes, and the held ones end.
				got := make([]bool, n)
				deadline := time.Now().Add(300 * time.Millisecond)
				for i, c := range pool {
					_ = c.SetReadDeadline(deadline)
					if k, _ := io.ReadFull(c, make([]byte, 2)); k == 0 {
						got[i] = true // held so far: told below
					}
				}
				p.OnServiceUpdate(svc, makeService("web"))
				p.Sync()
				want := make([]bool, n)
				for i, c := range pool {
					want[i] = i < limit
					if !got[i] {
						continue
					}
					_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
					k, err := io.ReadFull(c, make([]byte, 2))
					switch {
					case k == 2:
						got[i] = false // a slow greeting: not held
					case k > 0 || err != io.EOF:
						t.Fatalf("round %d, connection %d: %d bytes, %v; want the greeting or the FIN of the removed timeout", round, i, k, err)
					}
				}
				if diff := differing(got, want); len(diff) > 0 {
					t.Fatalf("round %d:\nfaulted:  %s\nfirst %d: %s\n%d of %d connections differ (first: %v)",
						round, pattern(got), limit, pattern(want), len(diff), n, diff[:min(len(diff), 10)])
				}
			}
		})
	}
}
