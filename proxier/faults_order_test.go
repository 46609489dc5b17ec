package proxier

import (
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
