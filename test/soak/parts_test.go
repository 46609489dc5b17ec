package soak

import (
	"bytes"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/proxier/config"
)

// The pieces TestSoak judges with, proven without namespaces.

func TestFitSlopePerMinute(t *testing.T) {
	mk := func(f func(m float64) float64) []sample {
		var out []sample
		for s := 0; s <= 600; s += 6 {
			at := time.Duration(s) * time.Second
			out = append(out, sample{At: at, FDs: f(at.Minutes())})
		}
		return out
	}
	fds := func(s sample) float64 { return s.FDs }
	for _, tc := range []struct {
		name    string
		samples []sample
		from    time.Duration
		want    float64
	}{
		{"flat", mk(func(float64) float64 { return 200 }), 0, 0},
		{"growth 12 per minute", mk(func(m float64) float64 { return 100 + 12*m }), 0, 12},
		{"warm-up excluded", mk(func(m float64) float64 { return 100 + 50*min(m, 2) }), 2 * time.Minute, 0},
		{"noise around flat", mk(func(m float64) float64 { return 200 + 20*math.Sin(m*7) }), time.Minute, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, _, n := fit(tc.samples, fds, tc.from)
			if n < 3 || math.Abs(got-tc.want) > 1.5 {
				t.Errorf("slope %.2f/min over %d samples, want %.2f", got, n, tc.want)
			}
		})
	}
	if _, _, n := fit(nil, fds, 0); n != 0 {
		t.Errorf("no samples fitted %d", n)
	}
}

func TestJudgeWindowAndTolerance(t *testing.T) {
	var samples []sample
	for s := 0; s <= 1800; s += 6 {
		at := time.Duration(s) * time.Second
		samples = append(samples, sample{At: at, FDs: 100 + 5*at.Minutes(), RSSKiB: 30000})
	}
	ss := []series{
		{Name: "fds", Get: func(s sample) float64 { return s.FDs }, Tolerance: 4},
		{Name: "rss", Get: func(s sample) float64 { return s.RSSKiB }, Tolerance: 1024, MinWindow: 10 * time.Minute},
	}
	vs := judge(samples, ss, 5*time.Minute, 30*time.Minute)
	if vs[0].ok || !vs[0].judged {
		t.Errorf("fds growing 5/min judged ok=%v judged=%v at tolerance 4", vs[0].ok, vs[0].judged)
	}
	if !vs[1].ok || !vs[1].judged {
		t.Errorf("flat RSS over 25 min: ok=%v judged=%v", vs[1].ok, vs[1].judged)
	}
	short := judge(samples[:20], ss, 30*time.Second, 2*time.Minute)
	if short[1].judged || !short[1].ok {
		t.Errorf("RSS over a 90 s window: judged=%v ok=%v, want shown but not judged", short[1].judged, short[1].ok)
	}
	// The 90 s run judges no slope of the proxy's own descriptors and
	// goroutines (noise over its minute; the idle check judges them), the
	// 30 min run every one.
	for _, tc := range []struct {
		duration   time.Duration
		wantJudged bool
	}{{90 * time.Second, false}, {30 * time.Minute, true}} {
		warmup := min(max(tc.duration/6, 30*time.Second), 5*time.Minute)
		for _, v := range judge(samples[:int(tc.duration/(6*time.Second))], resources, warmup, tc.duration) {
			if v.DeadPeers || v.Name == "RSS" {
				continue
			}
			if v.judged != tc.wantJudged {
				t.Errorf("%s over a %v run: judged %v, want %v", v.Name, tc.duration, v.judged, tc.wantJudged)
			}
		}
	}
}

func TestReadPatternCatchesLossAndCorruption(t *testing.T) {
	const seed, n = 7, 100_000
	good := make([]byte, n)
	_, _ = pattern(seed).Read(good)
	flipped := bytes.Clone(good)
	flipped[54321] ^= 1
	for _, tc := range []struct {
		name string
		data []byte
		want error
	}{
		{"intact", good, nil},
		{"one bit flipped", flipped, errCorrupt},
		{"truncated then clean EOF", good[:n-1], errShort},
		{"bytes past the end", append(bytes.Clone(good), 0), errCorrupt},
		{"a chunk missing", append(bytes.Clone(good[:1000]), good[2000:]...), errCorrupt},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := readPattern(bytes.NewReader(tc.data), seed, n, 4096, 0)
			if !errors.Is(err, tc.want) || (tc.want == nil && err != nil) {
				t.Fatalf("err %v, want %v", err, tc.want)
			}
			if tc.want == nil && got != n {
				t.Errorf("verified %d of %d", got, n)
			}
		})
	}
	_, err := readPattern(io.MultiReader(bytes.NewReader(good[:10]), errReader{}), seed, n, 4096, 0)
	if err == nil || errors.Is(err, errShort) || errors.Is(err, errCorrupt) {
		t.Errorf("a reset mid-stream: %v, want a plain read error (a cut, not a loss)", err)
	}
}

type errReader struct{}

func (errReader) Read([]byte) (int, error) { return 0, errors.New("connection reset by peer") }

func TestTalliesClassify(t *testing.T) {
	cut := errors.New("connection reset by peer")
	for _, tc := range []struct {
		name    string
		err     error
		removed bool
		field   func(*tally) int64
	}{
		{"success", nil, false, func(k *tally) int64 { return k.ok.Load() }},
		{"cut with its endpoint listed is a failure", cut, false, func(k *tally) int64 { return k.failed.Load() }},
		{"cut after its endpoint was removed", cut, true, func(k *tally) int64 { return k.cutRemoved.Load() }},
		{"corrupt even after removal", errCorrupt, true, func(k *tally) int64 { return k.corrupt.Load() }},
		{"a clean FIN short of the data is a loss even after removal", errShort, true, func(k *tally) int64 { return k.corrupt.Load() }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ts := newTallies()
			ts.end(kindNew, 10, tc.err, tc.removed, "x")
			if got := tc.field(ts.by[kindNew]); got != 1 {
				t.Errorf("counted %d, want 1", got)
			}
		})
	}
}

func TestChurnKeepsEveryServiceServedAndCountsRemovals(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "m")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	var backends []netip.Addr
	for i := range 8 {
		backends = append(backends, netip.AddrFrom4([4]byte{10, 77, 1, byte(11 + i)}))
	}
	s, err := newServices(dir, backends, 3)
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(3, 4))
	var removals int64
	for range 200 {
		i := rng.IntN(3)
		before := append([]int(nil), s.members[i]...)
		if err := s.churn(i, rng); err != nil {
			t.Fatal(err)
		}
		after := s.members[i]
		if n := len(after); n < minEndpoints || n > maxEndpoints || abs(n-len(before)) != 1 {
			t.Fatalf("service %d: %v -> %v", i, before, after)
		}
		if len(after) < len(before) {
			removals++
		}
	}
	var counted int64
	for i := range 3 {
		for b := range backends {
			counted += s.removed(i, b)
		}
	}
	if counted != removals || s.writes.Load() != 200 {
		t.Errorf("removals counted %d, made %d; writes %d", counted, removals, s.writes.Load())
	}
	data, err := os.ReadFile(filepath.Join(dir, "s01.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"kind: Service", "kind: EndpointSlice", "clusterIP: 10.96.1.2", backends[s.members[1][0]].String()} {
		if !strings.Contains(string(data), want) {
			t.Errorf("manifest lacks %q:\n%s", want, data)
		}
	}
}

func abs(n int) int { return max(n, -n) }

func TestPlotIsWellFormedSVG(t *testing.T) {
	var samples []sample
	for s := 0; s <= 120; s += 2 {
		samples = append(samples, sample{At: time.Duration(s) * time.Second, RSSKiB: 40000, FDs: float64(160 + s%7), Goroutines: 160})
	}
	svg := plot(samples, judge(samples, resources, 30*time.Second, 2*time.Minute), 30*time.Second)
	dec := xml.NewDecoder(strings.NewReader(svg))
	polylines := 0
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("not well-formed: %v", err)
		}
		if se, ok := tok.(xml.StartElement); ok && se.Name.Local == "polyline" {
			polylines++
		}
	}
	if polylines != len(resources) {
		t.Errorf("%d polylines, want one per series (%d)", polylines, len(resources))
	}
}

// The Service-churn group keeps its shape, never reuses a name, writes
// manifests the proxy takes, and leaves nothing once deleteAll ran.
func TestSvcChurnKeepsShapeAndFreshNames(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "m")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	backends := []netip.Addr{netip.MustParseAddr("10.77.1.11"), netip.MustParseAddr("10.77.1.12")}
	s := newSvcChurn(dir, backends, 3)
	names := map[string]bool{}
	for range 300 {
		if err := s.step(); err != nil {
			t.Fatal(err)
		}
		nodePorts := map[int32]bool{}
		for _, c := range s.live {
			names[c.name] = true
			if len(c.ports) != churnedPorts {
				t.Fatalf("%s has %d ports, want %d", c.name, len(c.ports), churnedPorts)
			}
			for _, p := range c.ports {
				if (p.nodePort != 0) != c.nodePort || (p.nodePort != 0 && nodePorts[p.nodePort]) {
					t.Fatalf("%s port %s: node port %d (NodePort Service %v, taken %v)", c.name, p.name, p.nodePort, c.nodePort, nodePorts[p.nodePort])
				}
				nodePorts[p.nodePort] = true
			}
			data, err := os.ReadFile(filepath.Join(dir, c.name+".yaml"))
			if err != nil {
				t.Fatal(err)
			}
			if _, errs := config.DecodeManifests(c.name+".yaml", data); len(errs) > 0 {
				t.Fatalf("%s: %v\n%s", c.name, errs, data)
			}
		}
		if len(s.live) > churnedLive {
			t.Fatalf("%d Services live, want at most %d", len(s.live), churnedLive)
		}
		if len(s.live) == churnedLive { // the shape the slopes rely on
			kinds := map[string]int{}
			for _, c := range s.live {
				kinds[fmt.Sprint("NodePort ", c.nodePort)]++
				for _, p := range c.ports {
					kinds[string(p.protocol)]++
				}
			}
			if want := churnedLive * churnedPorts / 2; kinds["TCP"] != want || kinds["UDP"] != want || kinds["NodePort true"] != churnedLive/2 {
				t.Fatalf("the group's shape changed: %v", kinds)
			}
		}
	}
	if len(names) != s.created || s.ops["deleted"] != s.created-churnedLive {
		t.Errorf("%d names seen, %d created, %d deleted", len(names), s.created, s.ops["deleted"])
	}
	for _, op := range []string{"deleted", "port replaced", "protocol flipped", "node ports toggled", "affinity toggled", "faults changed"} {
		if s.ops[op] == 0 {
			t.Errorf("no %q in 300 steps: %s", op, s.opCounts())
		}
	}
	if err := s.deleteAll(); err != nil {
		t.Fatal(err)
	}
	if left, _ := os.ReadDir(dir); len(left) != 0 || len(s.usedNodes) != 0 || len(s.usedIPs) != 0 {
		t.Errorf("after deleteAll: %d files, %d node ports, %d IPs held", len(left), len(s.usedNodes), len(s.usedIPs))
	}
}
