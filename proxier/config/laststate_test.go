package config

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/internal/lockedbuf"
)

func stateService(name, clusterIP string) *v1.Service {
	return &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, ResourceVersion: "7",
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubectl"}}},
		Spec: v1.ServiceSpec{ClusterIP: clusterIP, ClusterIPs: []string{clusterIP}, Type: v1.ServiceTypeClusterIP,
			Ports: []v1.ServicePort{{Name: "http", Protocol: v1.ProtocolTCP, Port: 80}}},
	}
}

func stateSlice(service, name, ip string) *discovery.EndpointSlice {
	port, proto, ready, portName := int32(8080), v1.ProtocolTCP, true, "http"
	return &discovery.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name,
			Labels: map[string]string{discovery.LabelServiceName: service}},
		AddressType: discovery.AddressTypeIPv4,
		Endpoints:   []discovery.Endpoint{{Addresses: []string{ip}, Conditions: discovery.EndpointConditions{Ready: &ready}}},
		Ports:       []discovery.EndpointPort{{Name: &portName, Port: &port, Protocol: &proto}},
	}
}

// runState runs s until the test ends and waits for Run to return then.
func runState(t *testing.T, s *LastKnownState) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		s.Run(ctx)
		close(done)
	}()
	stop = func() {
		cancel()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Fatal("Run did not return after its context ended")
		}
	}
	t.Cleanup(stop)
	return stop
}

func writeState(t *testing.T, path string, svcs []*v1.Service, slices []*discovery.EndpointSlice) {
	t.Helper()
	if err := WriteStateFile(path, State{Written: time.Now(), Services: svcs, EndpointSlices: slices}); err != nil {
		t.Fatal(err)
	}
}

func readState(t *testing.T, path string) (svcs, slices []string) {
	t.Helper()
	st, err := ReadStateFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range st.Services {
		svcs = append(svcs, s.Name+"="+s.Spec.ClusterIP)
	}
	for _, es := range st.EndpointSlices {
		slices = append(slices, es.Name+"="+es.Endpoints[0].Addresses[0])
	}
	return svcs, slices
}

func TestStateFileRoundTrip(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sub", "state.json") // the directory is made
	written := time.Date(2026, 12, 5, 3, 4, 5, 6, time.UTC)
	svc := stateService("web", "10.96.0.10")
	if err := WriteStateFile(path, State{Written: written,
		Services:       []*v1.Service{stateService("z", "10.96.0.11"), svc},
		EndpointSlices: []*discovery.EndpointSlice{stateSlice("web", "web-1", "10.1.0.5")}}); err != nil {
		t.Fatal(err)
	}
	if svc.Kind != "" || len(svc.ManagedFields) != 1 {
		t.Errorf("WriteStateFile changed the source's object: kind %q, %d managedFields", svc.Kind, len(svc.ManagedFields))
	}
	st, err := ReadStateFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !st.Written.Equal(written) {
		t.Errorf("Written = %v, want %v", st.Written, written)
	}
	if len(st.Services) != 2 || st.Services[0].Name != "web" || st.Services[1].Name != "z" {
		t.Fatalf("services %v, want web and z, in order", st.Services)
	}
	if got := st.Services[0]; got.Kind != "Service" || got.ManagedFields != nil || got.Spec.ClusterIP != "10.96.0.10" || got.ResourceVersion != "7" {
		t.Errorf("service read back: kind %q, managedFields %v, clusterIP %q, resourceVersion %q", got.Kind, got.ManagedFields, got.Spec.ClusterIP, got.ResourceVersion)
	}
	if len(st.EndpointSlices) != 1 || st.EndpointSlices[0].Endpoints[0].Addresses[0] != "10.1.0.5" {
		t.Fatalf("slices %v", st.EndpointSlices)
	}
	// A v1 List: the manifest decoder (explain --manifests) reads it too.
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	objs, errs := DecodeManifests(path, data)
	if len(errs) > 0 || len(objs) != 3 {
		t.Errorf("DecodeManifests: %d objects, errors %v", len(objs), errs)
	}
	if left, _ := filepath.Glob(filepath.Join(filepath.Dir(path), ".state.json.*")); len(left) > 0 {
		t.Errorf("temporary files left beside the state file: %v", left)
	}
}

func TestStateFileUnreadable(t *testing.T) {
	dir := t.TempDir()
	for name, content := range map[string]string{
		"garbage":    "not json",
		"other kind": `{"apiVersion":"v1","kind":"Service","metadata":{"name":"x"}}`,
		"pod inside": `{"apiVersion":"v1","kind":"List","items":[{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p"}}]}`,
	} {
		path := filepath.Join(dir, "state.json")
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := ReadStateFile(path); err == nil {
			t.Errorf("%s: read without an error", name)
		}
	}
}

// A start whose source has not synced within the grace serves the file;
// the source's sync then updates what it holds and deletes what it does
// not, without a second synced call.
func TestLastKnownStateServesFileUntilSourceSyncs(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.json")
	writeState(t, path, []*v1.Service{stateService("a", "10.96.0.1"), stateService("b", "10.96.0.2")},
		[]*discovery.EndpointSlice{stateSlice("a", "a-1", "10.1.0.1"), stateSlice("b", "b-1", "10.1.0.2")})
	rec := newManifestRecorder()
	s := NewLastKnownState(path, rec, 10*time.Millisecond)
	s.writeEvery = time.Hour // only the sync's and the stop's writes
	stop := runState(t, s)

	rec.waitFor(t, 5*time.Second,
		"add Service default/a", "add Service default/b",
		"add EndpointSlice default/a-1", "add EndpointSlice default/b-1",
		"synced Service", "synced EndpointSlice")
	if st := s.Status(); !st.Serving || !st.Written.IsZero() {
		t.Errorf("status while serving the file: %+v, want serving and nothing written", st)
	}

	// The API server answers: a changed, b gone, c new.
	s.OnServiceAdd(stateService("a", "10.96.0.1"))
	s.OnServiceAdd(stateService("c", "10.96.0.3"))
	s.OnEndpointSliceAdd(stateSlice("a", "a-1", "10.1.0.9"))
	s.OnServiceSynced()
	s.OnEndpointSlicesSynced()
	rec.waitFor(t, 5*time.Second,
		"update Service default/a", "add Service default/c", "update EndpointSlice default/a-1",
		"delete EndpointSlice default/b-1", "delete Service default/b")
	if got := rec.serviceYAML("default/a"); got.Kind != "" {
		t.Errorf("the proxier holds the file's Service a after the source delivered its own")
	}
	if s.Status().Serving {
		t.Error("status says serving the file after the source synced")
	}

	// Later events pass through.
	s.OnServiceDelete(stateService("c", "10.96.0.3"))
	rec.waitFor(t, time.Second, "delete Service default/c")

	stop()
	if st := s.Status(); st.Written.IsZero() || st.WriteErrors != 0 {
		t.Errorf("status after the stop: %+v, want a write and no errors", st)
	}
	svcs, slices := readState(t, path)
	if want := "[a=10.96.0.1]"; fmtList(svcs) != want {
		t.Errorf("file's services after the stop: %v, want %s", svcs, want)
	}
	if want := "[a-1=10.1.0.9]"; fmtList(slices) != want {
		t.Errorf("file's slices after the stop: %v, want %s", slices, want)
	}
}

func fmtList(l []string) string { return "[" + strings.Join(l, " ") + "]" }

// A source that syncs within the grace is all the proxier sees, and the
// file is rewritten from it.
func TestLastKnownStateSourceInTime(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.json")
	writeState(t, path, []*v1.Service{stateService("old", "10.96.0.1")}, nil)
	rec := newManifestRecorder()
	s := NewLastKnownState(path, rec, time.Hour)
	s.writeEvery = time.Hour
	runState(t, s)
	s.OnServiceAdd(stateService("new", "10.96.0.2"))
	s.OnServiceSynced()
	s.OnEndpointSlicesSynced()
	rec.waitFor(t, time.Second, "add Service default/new", "synced Service", "synced EndpointSlice")
	deadline := time.Now().Add(5 * time.Second)
	for {
		svcs, _ := readState(t, path)
		if fmtList(svcs) == "[new=10.96.0.2]" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the file still holds %v after the source synced", svcs)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Objects the source delivered before the grace ran out are not replaced
// by the file's; what the file adds is deleted at the sync if the source
// does not hold it.
func TestLastKnownStatePartialListBeforeGrace(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.json")
	writeState(t, path, []*v1.Service{stateService("a", "10.96.0.1"), stateService("b", "10.96.0.2")}, nil)
	rec := newManifestRecorder()
	s := NewLastKnownState(path, rec, 50*time.Millisecond)
	s.OnServiceAdd(stateService("a", "10.96.0.9")) // before Run: before the grace ends
	runState(t, s)
	rec.waitFor(t, 5*time.Second, "add Service default/a", "add Service default/b", "synced Service", "synced EndpointSlice")
	if got := rec.serviceYAML("default/a").Spec.ClusterIP; got != "10.96.0.9" {
		t.Errorf("Service a is the file's (%s), not the source's", got)
	}
	s.OnServiceSynced()
	s.OnEndpointSlicesSynced()
	rec.waitFor(t, time.Second, "delete Service default/b")
}

// Without a readable file the grace changes nothing: the proxier waits for
// the source, as without --state-file.
func TestLastKnownStateNoFile(t *testing.T) {
	for name, content := range map[string]string{"missing": "", "garbage": "{"} {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "state.json")
			if content != "" {
				if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			rec := newManifestRecorder()
			s := NewLastKnownState(path, rec, time.Millisecond)
			stop := runState(t, s)
			time.Sleep(50 * time.Millisecond)
			if ev := rec.take(); len(ev) > 0 {
				t.Fatalf("events before the source synced: %q", ev)
			}
			s.OnServiceAdd(stateService("a", "10.96.0.1"))
			s.OnServiceSynced()
			s.OnEndpointSlicesSynced()
			rec.waitFor(t, time.Second, "add Service default/a", "synced Service", "synced EndpointSlice")
			stop()
			if svcs, _ := readState(t, path); fmtList(svcs) != "[a=10.96.0.1]" {
				t.Errorf("file after the stop: %v", svcs)
			}
		})
	}
}

// The line at the grace's end, nothing from the source and no file, says
// what may keep the source, a refusal included: "The API server has not
// answered yet" was read below the API server's 403s (a missing RBAC grant).
func TestLastKnownStateGraceLineNamesARefusal(t *testing.T) {
	captureKlog(t)
	logs := &lockedbuf.Buffer{}
	klog.SetOutput(logs)
	s := NewLastKnownState(filepath.Join(t.TempDir(), "state.json"), newManifestRecorder(), time.Millisecond)
	s.bootstrap()
	klog.Flush()
	if got := logs.String(); !strings.Contains(got, "refuses the reads") || strings.Contains(got, "has not answered") {
		t.Errorf("the grace's line, no state file: %q; want it to name a refusal, not to say the API server has not answered", got)
	}
}

// A stop before the source synced keeps the file: a partial view must
// not replace the last full one.
func TestLastKnownStateStopBeforeSyncKeepsFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.json")
	writeState(t, path, []*v1.Service{stateService("a", "10.96.0.1"), stateService("b", "10.96.0.2")}, nil)
	rec := newManifestRecorder()
	s := NewLastKnownState(path, rec, time.Millisecond)
	stop := runState(t, s)
	rec.waitFor(t, 5*time.Second, "add Service default/a", "add Service default/b", "synced Service", "synced EndpointSlice")
	s.OnServiceAdd(stateService("c", "10.96.0.3"))
	stop()
	if svcs, _ := readState(t, path); fmtList(svcs) != "[a=10.96.0.1 b=10.96.0.2]" {
		t.Errorf("file after a stop before the sync: %v, want the one from before", svcs)
	}
}

// A source that synced one kind before the grace ran out is about to sync
// the other (it makes both calls at once): the file is not served, which
// would hand the proxier its stale objects for a moment.
func TestLastKnownStateOneKindSyncedBeforeGrace(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.json")
	writeState(t, path, []*v1.Service{stateService("b", "10.96.0.2")}, []*discovery.EndpointSlice{stateSlice("b", "b-1", "10.1.0.2")})
	rec := newManifestRecorder()
	s := NewLastKnownState(path, rec, 10*time.Millisecond)
	s.OnServiceAdd(stateService("a", "10.96.0.1"))
	s.OnServiceSynced()
	runState(t, s)
	rec.waitFor(t, time.Second, "add Service default/a", "synced Service")
	time.Sleep(100 * time.Millisecond) // the grace runs out
	s.OnEndpointSlicesSynced()
	rec.waitFor(t, time.Second, "synced EndpointSlice")
	if s.Status().Serving {
		t.Error("status says serving the file")
	}
}

// An object the source deleted before the grace ran out stays deleted: the
// file, older, must not bring it back (it did, and served it until the
// other kind's list came).
func TestLastKnownStateDeletedBeforeGraceStaysDeleted(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.json")
	writeState(t, path, []*v1.Service{stateService("a", "10.96.0.1"), stateService("x", "10.96.0.9")}, nil)
	rec := newManifestRecorder()
	s := NewLastKnownState(path, rec, 10*time.Millisecond)
	s.OnServiceAdd(stateService("x", "10.96.0.9"))
	s.OnServiceDelete(stateService("x", "10.96.0.9"))
	runState(t, s)
	rec.waitFor(t, 5*time.Second, "add Service default/x", "delete Service default/x",
		"add Service default/a", "synced Service", "synced EndpointSlice")
}

// BenchmarkWriteStateFile10k writes 10,000 Services and their slices: the
// cost of one write of a large cluster's state (at most one per 10 s).
func BenchmarkWriteStateFile10k(b *testing.B) {
	st := State{Written: time.Now()}
	for i := range 10000 {
		name := fmt.Sprintf("svc-%05d", i)
		ip := fmt.Sprintf("10.%d.%d.%d", 96+i/65536, i/256%256, i%256)
		st.Services = append(st.Services, stateService(name, ip))
		st.EndpointSlices = append(st.EndpointSlices, stateSlice(name, name+"-1", ip))
	}
	path := filepath.Join(b.TempDir(), "state.json")
	b.ReportAllocs()
	for b.Loop() {
		if err := WriteStateFile(path, st); err != nil {
			b.Fatal(err)
		}
	}
	if fi, err := os.Stat(path); err == nil {
		b.ReportMetric(float64(fi.Size())/(1<<20), "MiB")
	}
}

// A file that cannot be written is counted (and logged); the proxier is
// served as ever.
func TestLastKnownStateWriteErrorsCounted(t *testing.T) {
	dir := t.TempDir()
	blocker := filepath.Join(dir, "not-a-dir")
	if err := os.WriteFile(blocker, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	rec := newManifestRecorder()
	s := NewLastKnownState(filepath.Join(blocker, "state.json"), rec, time.Hour)
	s.writeEvery = 10 * time.Millisecond
	stop := runState(t, s)
	s.OnServiceAdd(stateService("a", "10.96.0.1"))
	s.OnServiceSynced()
	s.OnEndpointSlicesSynced()
	rec.waitFor(t, time.Second, "add Service default/a", "synced Service", "synced EndpointSlice")
	// A failed write is tried again with nothing changed (before, it
	// waited for the next change: 2 failures, then none).
	for deadline := time.Now().Add(5 * time.Second); s.Status().WriteErrors < 3; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("status: %+v, want the failed write tried again", s.Status())
		}
	}
	stop()
	// At least the stop's write was tried, even when the stop came before
	// Run saw the sync (it returned without writing: 9 of 20 runs).
	if st := s.Status(); st.WriteErrors < 1 || !st.Written.IsZero() {
		t.Errorf("status: %+v, want failed writes counted, none written", st)
	}
}

// nodeRecorder is a NodeHandler writing into a manifestRecorder's events,
// so that their order with the Service calls shows: "node node-a zone=z1",
// "node synced".
type nodeRecorder struct{ r *manifestRecorder }

func (n nodeRecorder) note(line string) {
	n.r.mu.Lock()
	n.r.events = append(n.r.events, line)
	n.r.mu.Unlock()
	select {
	case n.r.notify <- struct{}{}:
	default:
	}
}

func (n nodeRecorder) OnNodeChange(info NodeInfo) {
	n.note(fmt.Sprintf("node %s zone=%s", info.Name, info.Zone))
}

func (n nodeRecorder) OnNodeSynced() { n.note("node synced") }

// The file keeps the Node's zone: a start that serves the file hands it
// on before the objects (the first sync routes by topology hints as the
// last process did), and the source's own Node replaces it, or its
// absence clears it.
func TestLastKnownStateKeepsTheNodeZone(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.json")
	first := newManifestRecorder()
	s := NewLastKnownState(path, first, time.Hour)
	nodes := s.Nodes("node-a", nodeRecorder{first})
	stop := runState(t, s)
	s.OnServiceAdd(stateService("a", "10.96.0.1"))
	s.OnServiceSynced()
	s.OnEndpointSlicesSynced()
	nodes.OnNodeChange(NodeInfo{Name: "node-a", Zone: "zone-1"})
	nodes.OnNodeSynced()
	first.waitFor(t, time.Second, "add Service default/a", "synced Service", "synced EndpointSlice",
		"node node-a zone=zone-1", "node synced")
	stop()
	if st, err := ReadStateFile(path); err != nil || st.Node != "node-a" || st.Zone != "zone-1" {
		t.Fatalf("file's node %q zone %q (%v), want node-a in zone-1", st.Node, st.Zone, err)
	}

	restart := func(name string) (*LastKnownState, NodeHandler, *manifestRecorder) {
		rec := newManifestRecorder()
		s := NewLastKnownState(path, rec, 10*time.Millisecond)
		s.writeEvery = time.Hour
		nodes := s.Nodes(name, nodeRecorder{rec})
		runState(t, s)
		return s, nodes, rec
	}

	t.Run("the source's Node replaces the file's zone", func(t *testing.T) {
		_, nodes, rec := restart("node-a")
		rec.waitFor(t, 5*time.Second, "node node-a zone=zone-1", "add Service default/a", "synced Service", "synced EndpointSlice")
		nodes.OnNodeChange(NodeInfo{Name: "node-a", Zone: "zone-2"})
		nodes.OnNodeSynced()
		rec.waitFor(t, time.Second, "node node-a zone=zone-2", "node synced")
	})
	t.Run("no Node at the source's sync clears it", func(t *testing.T) {
		_, nodes, rec := restart("node-a")
		rec.waitFor(t, 5*time.Second, "node node-a zone=zone-1", "add Service default/a", "synced Service", "synced EndpointSlice")
		nodes.OnNodeSynced()
		rec.waitFor(t, time.Second, "node node-a zone=", "node synced")
	})
	t.Run("no zone once the Node informer listed none", func(t *testing.T) {
		rec := newManifestRecorder()
		s := NewLastKnownState(path, rec, 10*time.Millisecond)
		s.writeEvery = time.Hour
		nodes := s.Nodes("node-a", nodeRecorder{rec})
		nodes.OnNodeSynced() // before the grace ends: no Node of this name
		runState(t, s)
		rec.waitFor(t, 5*time.Second, "node synced", "add Service default/a", "synced Service", "synced EndpointSlice")
	})
	t.Run("a file of another node gives no zone", func(t *testing.T) {
		_, _, rec := restart("node-b")
		rec.waitFor(t, 5*time.Second, "add Service default/a", "synced Service", "synced EndpointSlice")
	})
}

// The file keeps the Node's addresses too, which a start that cannot read
// its Node from the API server takes its node IPs from (ReadStateNode
// reads them without the objects): a restart during an outage DNATed to
// the default route's address instead.
func TestLastKnownStateKeepsTheNodeAddresses(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.json")
	rec := newManifestRecorder()
	s := NewLastKnownState(path, rec, time.Hour)
	nodes := s.Nodes("node-a", nodeRecorder{rec})
	stop := runState(t, s)
	s.OnServiceAdd(stateService("a", "10.96.0.1"))
	s.OnServiceSynced()
	s.OnEndpointSlicesSynced()
	addrs := []netip.Addr{netip.MustParseAddr("10.1.0.5"), netip.MustParseAddr("fd00::5")}
	nodes.OnNodeChange(NodeInfo{Name: "node-a", Addresses: addrs}) // no zone
	nodes.OnNodeSynced()
	rec.waitFor(t, time.Second, "add Service default/a", "synced Service", "synced EndpointSlice", "node node-a zone=", "node synced")
	stop()
	st, err := ReadStateFile(path)
	if err != nil || st.Node != "node-a" || !slices.Equal(st.NodeIPs, addrs) {
		t.Fatalf("file's node %q IPs %v (%v), want node-a with %v", st.Node, st.NodeIPs, err, addrs)
	}
	node, ips, err := ReadStateNode(path)
	if err != nil || node != "node-a" || !slices.Equal(ips, addrs) {
		t.Fatalf("ReadStateNode: %q %v (%v), want node-a with %v", node, ips, err, addrs)
	}
}

// A proxy that waited behind another (cmd: a second proxy in the network
// namespace waits for the first to exit) runs Run long after its grace
// began (GraceFrom: the process's start), its source running all along.
// Synced meanwhile: the file is never served, though the grace used up and
// the sync are both ready when Run starts. Not synced (the API server away
// the whole wait): the file, the other proxy's last write, is served at
// once, not after a grace counted anew.
func TestLastKnownStateGraceUsedUpWhileWaiting(t *testing.T) {
	t.Run("synced meanwhile", func(t *testing.T) {
		for range 20 { // Run's select takes either of the two ready cases
			path := filepath.Join(t.TempDir(), "state.json")
			writeState(t, path, []*v1.Service{stateService("old", "10.96.0.1")}, nil)
			rec := newManifestRecorder()
			s := NewLastKnownState(path, rec, time.Second)
			s.writeEvery = time.Hour
			s.GraceFrom(time.Now().Add(-time.Hour))
			s.OnServiceAdd(stateService("new", "10.96.0.2"))
			s.OnServiceSynced()
			s.OnEndpointSlicesSynced()
			stop := runState(t, s)
			deadline := time.Now().Add(5 * time.Second)
			for { // the sync's write: Run is past its wait
				if svcs, _ := readState(t, path); fmtList(svcs) == "[new=10.96.0.2]" {
					break
				}
				if time.Now().After(deadline) {
					t.Fatal("the file not rewritten from the source within 5 s")
				}
				time.Sleep(5 * time.Millisecond)
			}
			stop()
			for _, ev := range rec.take() {
				if strings.Contains(ev, "default/old") {
					t.Fatalf("the file's Service served after the source synced: %s", ev)
				}
			}
			if s.Status().Serving {
				t.Fatal("status says serving the file after the source synced")
			}
		}
	})
	t.Run("not synced", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "state.json")
		writeState(t, path, []*v1.Service{stateService("old", "10.96.0.1")}, nil)
		rec := newManifestRecorder()
		s := NewLastKnownState(path, rec, time.Hour)
		s.GraceFrom(time.Now().Add(-2 * time.Hour))
		runState(t, s)
		rec.waitFor(t, 5*time.Second, "add Service default/old", "synced Service", "synced EndpointSlice")
	})
}
