package config

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/internal/regularfile"
)

// State is what a state file holds.
type State struct {
	Written        time.Time
	Services       []*v1.Service
	EndpointSlices []*discovery.EndpointSlice
	// Node and its Zone (topology.kubernetes.io/zone), when the source
	// gave the Node and it has one; NodeIPs are its addresses
	// (InternalIPs, then ExternalIPs).
	Node, Zone string
	NodeIPs    []netip.Addr
	// Skipped are the objects ReadStateFile left out, as invalid.
	Skipped []error
}

// Annotations of the file's List: State.Written, State.Node, State.Zone
// and State.NodeIPs.
const (
	stateWrittenAnnotation = "kube-userspace-proxy/state-written"
	stateNodeAnnotation    = "kube-userspace-proxy/state-node"
	stateZoneAnnotation    = "kube-userspace-proxy/state-node-zone"
	stateNodeIPsAnnotation = "kube-userspace-proxy/state-node-ips"
)

// stateList is the file: a v1 List of the objects (so that `explain
// --manifests` and kubectl read it too), written when.
type stateList struct {
	metav1.TypeMeta `json:",inline"`
	Metadata        struct {
		Annotations map[string]string `json:"annotations"`
	} `json:"metadata"`
	Items []json.RawMessage `json:"items"`
}

// WriteStateFile writes state to path through a file beside it and a
// rename, so that a crash mid-write leaves the previous file whole.
// Objects are written sorted, with their kind and without managedFields.
func WriteStateFile(path string, state State) error {
	slices.SortFunc(state.Services, func(a, b *v1.Service) int {
		return strings.Compare(objKey(a), objKey(b))
	})
	slices.SortFunc(state.EndpointSlices, func(a, b *discovery.EndpointSlice) int {
		return strings.Compare(objKey(a), objKey(b))
	})
	list := stateList{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "List"}}
	list.Metadata.Annotations = map[string]string{stateWrittenAnnotation: state.Written.UTC().Format(time.RFC3339Nano)}
	if state.Zone != "" {
		list.Metadata.Annotations[stateNodeAnnotation] = state.Node
		list.Metadata.Annotations[stateZoneAnnotation] = state.Zone
	}
	if len(state.NodeIPs) > 0 {
		list.Metadata.Annotations[stateNodeAnnotation] = state.Node
		ips := make([]string, len(state.NodeIPs))
		for i, ip := range state.NodeIPs {
			ips[i] = ip.String()
		}
		list.Metadata.Annotations[stateNodeIPsAnnotation] = strings.Join(ips, ",")
	}
	for _, svc := range state.Services {
		c := *svc // the source's object is shared: change a copy
		c.TypeMeta = metav1.TypeMeta{APIVersion: "v1", Kind: "Service"}
		c.ManagedFields = nil
		b, err := json.Marshal(&c)
		if err != nil {
			return err
		}
		list.Items = append(list.Items, b)
	}
	for _, es := range state.EndpointSlices {
		c := *es
		c.TypeMeta = metav1.TypeMeta{APIVersion: "discovery.k8s.io/v1", Kind: "EndpointSlice"}
		c.ManagedFields = nil
		b, err := json.Marshal(&c)
		if err != nil {
			return err
		}
		list.Items = append(list.Items, b)
	}
	data, err := json.Marshal(&list)
	if err != nil {
		return err
	}
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // after the rename: nothing to remove
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// stateFileHead is how every file WriteStateFile writes begins
// (stateList's TypeMeta, marshalled first).
var stateFileHead = []byte(`{"kind":"List",`)

// CheckStateFile tells whether path may be a --state-file: WriteStateFile
// replaces whatever is there, so only a path that is not there, an empty
// file or a v1 List (what WriteStateFile writes, and what ReadStateFile
// reads: `kubectl get services,endpointslices -o json` gives one too) is
// taken. A kubeconfig or --config file named by mistake was replaced
// within seconds of the first sync.
func CheckStateFile(path string) error {
	info, err := os.Stat(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil
	case err != nil:
		return err
	case info.Mode().IsRegular() && info.Size() == 0:
		return nil
	}
	data, err := regularfile.Read(path, maxStateFileSize, nil)
	if err != nil {
		var pathErr *fs.PathError
		if errors.As(err, &pathErr) {
			return pathErr.Err // the caller names the file
		}
		return err
	}
	var head metav1.TypeMeta
	if bytes.HasPrefix(data, stateFileHead) {
		// What WriteStateFile begins with, even if the rest no longer
		// decodes: the proxy's own state, which the next write mends. A
		// refusal would hold a restarted proxy down until someone
		// removed it.
		return nil
	}
	if json.Unmarshal(data, &head) != nil || head.Kind != "List" { // as ReadStateFile reads it
		return errors.New("holds something other than a state file (a JSON List, as this proxy writes it), which the first write would replace: give the state a path of its own")
	}
	return nil
}

// removeStaleTemps removes the temporary files a process killed while it
// wrote path left beside it (on tmpfs they would stay until a reboot).
func removeStaleTemps(path string) {
	stale, _ := filepath.Glob(filepath.Join(filepath.Dir(path), "."+filepath.Base(path)+".*"))
	for _, f := range stale {
		_ = os.Remove(f)
	}
}

// maxStateFileSize bounds what a state file is read into memory: 10,000
// small Services and their slices are 6 MiB.
const maxStateFileSize = 1 << 30

// readStateData reads the state file if the proxy can trust it: a regular
// file (not a FIFO, which would block the read), owned by the proxy's uid
// and writable by no one else, as WriteStateFile leaves it (0600), the
// checks ssh makes of a key. Its objects are served, and its node IPs taken,
// before the API server answers: another user's file, in a directory open
// to them, was served as it was, a loopback externalIP included.
func readStateData(path string) ([]byte, error) {
	data, err := regularfile.Read(path, maxStateFileSize, func(info os.FileInfo) error {
		if st, ok := info.Sys().(*syscall.Stat_t); ok && int(st.Uid) != os.Geteuid() {
			return fmt.Errorf("owned by uid %d, not %d (this proxy's): not trusted", st.Uid, os.Geteuid())
		}
		if perm := info.Mode().Perm(); perm&0o022 != 0 {
			return fmt.Errorf("writable by group or others (mode %04o): not trusted", perm)
		}
		return nil
	})
	var pathErr *fs.PathError
	if err != nil && !errors.As(err, &pathErr) { // a PathError names the file
		err = fmt.Errorf("%s: %w", path, err)
	}
	return data, err
}

// validStateObject checks an object of the state file with the manifests'
// validation (on a defaulted copy: the object served is the one kept),
// less what the API server does not check either: the proxy's own
// annotations (a Service with a bad faults annotation is served without
// faults from the informers, and so from the file), LoadBalancer ingress
// IPs (one no portal may have is left out of its Service, which is
// served; an ipMode it does not know gets none either), a
// trafficDistribution it does not know, the node port range (the cluster's may be another) and what only
// strict IP validation refuses (IPv4-mapped addresses: an API server before
// 1.36, or an object older than its strict validation, gives them, and the
// informers serve them unmapped).
func validStateObject(obj runtime.Object) error {
	obj = obj.DeepCopyObject()
	setDefaults(obj)
	var fe fieldErrors
	switch o := obj.(type) {
	case *v1.Service:
		validateService(&fe, o, PortRange{Min: 1, Max: 65535})
	case *discovery.EndpointSlice:
		validateEndpointSlice(&fe, o)
	}
	// What the informers would serve: they take the proxy's annotations
	// without faults, and an ingress IP no portal may have (loopback,
	// link-local; the API server accepts them) gets none while the rest
	// of its Service is served (servicePorts).
	// Nor a trafficDistribution of a later API server, which only its
	// EndpointSlice controller reads.
	annotations := field.NewPath("metadata", "annotations").String()
	ingress := field.NewPath("status", "loadBalancer", "ingress").String()
	distribution := field.NewPath("spec", "trafficDistribution").String()
	fe = slices.DeleteFunc(fe, func(e *fieldError) bool {
		return e.strict || strings.HasPrefix(e.Path, annotations) || strings.HasPrefix(e.Path, ingress) || e.Path == distribution
	})
	return fe.err()
}

// ReadStateFile reads a file WriteStateFile wrote. An object that is not
// valid is left out, and named in State.Skipped.
func ReadStateFile(path string) (State, error) {
	var state State
	data, err := readStateData(path)
	if err != nil {
		return state, err
	}
	var list stateList
	if err := json.Unmarshal(data, &list); err != nil {
		return state, fmt.Errorf("%s: %w", path, err)
	}
	if list.Kind != "List" {
		return state, fmt.Errorf("%s: not a state file (kind %q, want List)", path, list.Kind)
	}
	if w, ok := list.Metadata.Annotations[stateWrittenAnnotation]; ok {
		if state.Written, err = time.Parse(time.RFC3339Nano, w); err != nil {
			return state, fmt.Errorf("%s: annotation %s: %w", path, stateWrittenAnnotation, err)
		}
	}
	state.Node = list.Metadata.Annotations[stateNodeAnnotation]
	state.Zone = list.Metadata.Annotations[stateZoneAnnotation]
	if state.NodeIPs, err = parseNodeIPs(list.Metadata.Annotations[stateNodeIPsAnnotation]); err != nil {
		return state, fmt.Errorf("%s: annotation %s: %w", path, stateNodeIPsAnnotation, err)
	}
	for i, item := range list.Items {
		var tm metav1.TypeMeta
		if err := json.Unmarshal(item, &tm); err != nil {
			return state, fmt.Errorf("%s: item %d: %w", path, i, err)
		}
		switch tm.Kind {
		case "Service":
			svc := &v1.Service{}
			if err := json.Unmarshal(item, svc); err != nil {
				return state, fmt.Errorf("%s: item %d (Service): %w", path, i, err)
			}
			if err := validStateObject(svc); err != nil {
				state.Skipped = append(state.Skipped, fmt.Errorf("item %d, Service %s: %w", i, objKey(svc), err))
				continue
			}
			state.Services = append(state.Services, svc)
		case "EndpointSlice":
			es := &discovery.EndpointSlice{}
			if err := json.Unmarshal(item, es); err != nil {
				return state, fmt.Errorf("%s: item %d (EndpointSlice): %w", path, i, err)
			}
			if err := validStateObject(es); err != nil {
				state.Skipped = append(state.Skipped, fmt.Errorf("item %d, EndpointSlice %s: %w", i, objKey(es), err))
				continue
			}
			state.EndpointSlices = append(state.EndpointSlices, es)
		default:
			return state, fmt.Errorf("%s: item %d: kind %q is neither Service nor EndpointSlice", path, i, tm.Kind)
		}
	}
	return state, nil
}

func parseNodeIPs(v string) ([]netip.Addr, error) {
	if v == "" {
		return nil, nil
	}
	var out []netip.Addr
	for f := range strings.SplitSeq(v, ",") {
		ip, err := netip.ParseAddr(f)
		if err != nil {
			return nil, err
		}
		out = append(out, ip)
	}
	return out, nil
}

// ReadStateNode reads only the Node a state file was written for and its
// addresses, without decoding its objects: a start that could not read
// its Node from the API server takes its node IPs from here before
// anything else.
func ReadStateNode(path string) (node string, ips []netip.Addr, err error) {
	data, err := readStateData(path)
	if err != nil {
		return "", nil, err
	}
	var head struct {
		Kind     string `json:"kind"`
		Metadata struct {
			Annotations map[string]string `json:"annotations"`
		} `json:"metadata"`
	}
	if err := json.Unmarshal(data, &head); err != nil {
		return "", nil, fmt.Errorf("%s: %w", path, err)
	}
	if head.Kind != "List" {
		return "", nil, fmt.Errorf("%s: not a state file (kind %q, want List)", path, head.Kind)
	}
	ips, err = parseNodeIPs(head.Metadata.Annotations[stateNodeIPsAnnotation])
	if err != nil {
		return "", nil, fmt.Errorf("%s: annotation %s: %w", path, stateNodeIPsAnnotation, err)
	}
	return head.Metadata.Annotations[stateNodeAnnotation], ips, nil
}
