package controlplane

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// Options change how the control plane runs; the zero value is what most tests want.
type Options struct {
	// NetNS, when set, is the name of a network namespace (ip netns) both programs run
	// in, on its loopback; the harness and the clients it returns dial into it. The
	// namespace's lo must be up.
	NetNS string
	// ServiceClusterIPRange defaults to 10.96.0.0/12.
	ServiceClusterIPRange string
	// ExtraAPIServerArgs are appended to kube-apiserver's command line.
	ExtraAPIServerArgs []string
	// ReadyTimeout bounds each wait for /readyz; default 90 s (the machine is shared).
	ReadyTimeout time.Duration
}

// ControlPlane is a running etcd and kube-apiserver. The exported fields are fixed for its
// lifetime, across API-server restarts.
type ControlPlane struct {
	// Server is the API server's URL, https://127.0.0.1:PORT.
	Server string
	// CAFile verifies Server (kube-apiserver's self-signed certificate).
	CAFile string
	// AdminToken is in group system:masters; ProxyToken authenticates as ProxyUser.
	AdminToken, ProxyToken string
	// AdminKubeconfig and ProxyKubeconfig are kubeconfig files for the two tokens.
	AdminKubeconfig, ProxyKubeconfig string
	// EtcdURL is etcd's client URL.
	EtcdURL string

	opts     Options
	bins     Binaries
	dir      string
	creds    credentials
	apiArgs  []string
	etcdArgs []string
	dial     func(ctx context.Context, network, addr string) (net.Conn, error)
	probe    *http.Client // /readyz client, made once the certificate exists
	// notReady is the last /readyz?verbose answer that was not ok (or the
	// probe's error), said when the wait for it times out.
	notReady  string
	admin     kubernetes.Interface // for the authorizer probe
	mu        sync.Mutex           // guards the processes across Stop/Start from different goroutines
	etcd, api *process
}

// Start runs etcd and kube-apiserver, waits until /readyz is ok and the kubeconfigs are
// written, and stops everything when tb ends. It skips tb when the binaries are not
// built (see FindBinaries).
func Start(tb testing.TB, opts Options) *ControlPlane {
	tb.Helper()
	bins := FindBinaries(tb)
	cp, err := start(bins, opts)
	if cp != nil {
		tb.Cleanup(func() {
			if tb.Failed() {
				tb.Logf("etcd log (end):\n%s", tailFile(filepath.Join(cp.dir, "etcd.log"), 20))
				tb.Logf("kube-apiserver log (end):\n%s", tailFile(filepath.Join(cp.dir, "kube-apiserver.log"), 40))
			}
			cp.Stop()
		})
	}
	if err != nil {
		tb.Fatalf("control plane: %v", err)
	}
	return cp
}

func start(bins Binaries, opts Options) (*ControlPlane, error) {
	if opts.ServiceClusterIPRange == "" {
		opts.ServiceClusterIPRange = "10.96.0.0/12"
	}
	if opts.ReadyTimeout <= 0 {
		opts.ReadyTimeout = 90 * time.Second
	}
	dir, err := os.MkdirTemp("", "kup-controlplane-")
	if err != nil {
		return nil, err
	}
	cp := &ControlPlane{opts: opts, bins: bins, dir: dir, dial: (&net.Dialer{}).DialContext}
	if opts.NetNS != "" {
		cp.dial = dialInNetNS(filepath.Join("/var/run/netns", opts.NetNS))
	}
	if cp.creds, err = writeCredentials(dir); err != nil {
		return cp, err
	}
	cp.AdminToken, cp.ProxyToken = cp.creds.adminToken, cp.creds.proxyToken

	// The ports were free a moment ago; another process may take one before etcd or
	// kube-apiserver binds it. Then start over on other ports.
	for attempt := 1; ; attempt++ {
		err = cp.startOnFreePorts()
		if err == nil || attempt == 3 || !strings.Contains(err.Error(), "address already in use") {
			break
		}
		cp.stopProcesses()
		if err := os.RemoveAll(filepath.Join(dir, "etcd")); err != nil {
			return cp, err
		}
	}
	if err != nil {
		return cp, err
	}
	return cp, cp.writeKubeconfigs()
}

// pickPorts is freePorts; a test replaces it to force a port collision.
var pickPorts = freePorts

// startOnFreePorts starts etcd and kube-apiserver on ports chosen now.
func (cp *ControlPlane) startOnFreePorts() error {
	cp.probe, cp.admin = nil, nil // clients of an earlier attempt know the old port
	ports, err := pickPorts(3)
	if err != nil {
		return err
	}
	if err := cp.startEtcd(ports[0], ports[1]); err != nil {
		return err
	}
	cp.Server = "https://127.0.0.1:" + strconv.Itoa(ports[2])
	cp.CAFile = filepath.Join(cp.dir, "certs", "apiserver.crt")
	cp.apiArgs = cp.apiServerArgs(ports[2])
	return cp.StartAPIServer()
}

// startEtcd runs etcd on loopback without fsync (a test's data need not survive a crash)
// and waits for its /health.
func (cp *ControlPlane) startEtcd(clientPort, peerPort int) error {
	cp.EtcdURL = "http://127.0.0.1:" + strconv.Itoa(clientPort)
	peer := "http://127.0.0.1:" + strconv.Itoa(peerPort)
	args := []string{
		"--name=kup",
		"--data-dir=" + filepath.Join(cp.dir, "etcd"),
		"--listen-client-urls=" + cp.EtcdURL,
		"--advertise-client-urls=" + cp.EtcdURL,
		"--listen-peer-urls=" + peer,
		"--initial-advertise-peer-urls=" + peer,
		"--initial-cluster=kup=" + peer,
		"--unsafe-no-fsync",
		"--log-level=warn",
	}
	cp.etcdArgs = args
	return cp.StartEtcd()
}

// StartEtcd starts etcd (again, after StopEtcd: same ports and data) and waits for its
// /health.
func (cp *ControlPlane) StartEtcd() error {
	cp.mu.Lock()
	if cp.etcd != nil && cp.etcd.running() {
		cp.mu.Unlock()
		return fmt.Errorf("etcd is already running")
	}
	p, err := startProcess("etcd", cp.bins.Etcd, cp.etcdArgs, filepath.Join(cp.dir, "etcd.log"), cp.opts.NetNS)
	if err == nil {
		cp.etcd = p
	}
	cp.mu.Unlock()
	if err != nil {
		return err
	}
	client := &http.Client{Transport: &http.Transport{DialContext: cp.dial}, Timeout: 2 * time.Second}
	return waitUntil(p, cp.opts.ReadyTimeout, func() bool { return httpOK(client, cp.EtcdURL+"/health") })
}

// StopEtcd stops etcd (SIGTERM, then SIGKILL after 5 s) and leaves kube-apiserver
// running: a storage outage, which the API server's clients see as errors and timeouts.
func (cp *ControlPlane) StopEtcd() {
	cp.mu.Lock()
	p := cp.etcd
	cp.mu.Unlock()
	if p != nil {
		p.stop(5 * time.Second)
	}
}

func (cp *ControlPlane) apiServerArgs(port int) []string {
	args := []string{
		"--etcd-servers=" + cp.EtcdURL,
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(port),
		"--cert-dir=" + filepath.Join(cp.dir, "certs"),
		"--token-auth-file=" + cp.creds.tokenFile,
		"--authorization-mode=RBAC",
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file=" + cp.creds.serviceAccountKey,
		"--service-account-signing-key-file=" + cp.creds.serviceAccountKey,
		"--disable-admission-plugins=ServiceAccount",
		"--endpoint-reconciler-type=none",
		"--service-cluster-ip-range=" + cp.opts.ServiceClusterIPRange,
		"--allow-privileged=true",
		"--v=1",
	}
	return append(args, cp.opts.ExtraAPIServerArgs...)
}

// StartAPIServer starts kube-apiserver (again, after StopAPIServer: same port, certificate
// and tokens) and waits for /readyz.
func (cp *ControlPlane) StartAPIServer() error {
	cp.mu.Lock()
	if cp.api != nil && cp.api.running() {
		cp.mu.Unlock()
		return fmt.Errorf("kube-apiserver is already running")
	}
	p, err := startProcess("kube-apiserver", cp.bins.APIServer, cp.apiArgs,
		filepath.Join(cp.dir, "kube-apiserver.log"), cp.opts.NetNS)
	if err == nil {
		cp.api = p
	}
	cp.mu.Unlock()
	if err != nil {
		return err
	}
	if err := waitUntil(p, cp.opts.ReadyTimeout, cp.ready); err != nil {
		return fmt.Errorf("%w\nits last /readyz?verbose: %s", err, cp.notReady)
	}
	// /readyz turns ok before the RBAC authorizer has loaded the roles; until then every
	// request that is not from system:masters is forbidden. Return once it authorizes.
	if err := waitUntil(p, cp.opts.ReadyTimeout, cp.authorizes); err != nil {
		return fmt.Errorf("%w\n(/readyz was ok: its RBAC authorizer did not grant system:basic-user's rules)", err)
	}
	return nil
}

// authorizes reports whether RBAC grants every authenticated user what the bootstrap
// role system:basic-user grants, i.e. whether the authorizer has its roles.
func (cp *ControlPlane) authorizes() bool {
	if cp.admin == nil {
		c, err := kubernetes.NewForConfig(cp.AdminConfig())
		if err != nil {
			return false
		}
		cp.admin = c
	}
	review := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
		User:   "kup-probe",
		Groups: []string{"system:authenticated"},
		ResourceAttributes: &authorizationv1.ResourceAttributes{
			Verb: "create", Group: "authorization.k8s.io", Resource: "selfsubjectaccessreviews",
		},
	}}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	got, err := cp.admin.AuthorizationV1().SubjectAccessReviews().Create(ctx, review, metav1.CreateOptions{})
	return err == nil && got.Status.Allowed
}

// StopAPIServer stops kube-apiserver (SIGTERM, then SIGKILL after 10 s) and leaves etcd
// running: an API-server outage, as clients see it.
func (cp *ControlPlane) StopAPIServer() {
	cp.mu.Lock()
	p := cp.api
	cp.mu.Unlock()
	if p != nil {
		p.stop(10 * time.Second)
	}
}

// Stop stops kube-apiserver and etcd by PID and removes every file the control plane
// wrote. It is safe to call more than once.
func (cp *ControlPlane) Stop() {
	cp.stopProcesses()
	if cp.dir != "" {
		_ = os.RemoveAll(cp.dir)
	}
}

// stopProcesses stops kube-apiserver, then etcd.
func (cp *ControlPlane) stopProcesses() {
	cp.StopAPIServer()
	cp.mu.Lock()
	p := cp.etcd
	cp.mu.Unlock()
	if p != nil {
		p.stop(5 * time.Second)
	}
}

// AdminConfig returns a client configuration with the admin token.
func (cp *ControlPlane) AdminConfig() *rest.Config { return cp.restConfig(cp.AdminToken) }

// ProxyConfig returns a client configuration with the proxy token.
func (cp *ControlPlane) ProxyConfig() *rest.Config { return cp.restConfig(cp.ProxyToken) }

// AdminClient returns a clientset with the admin token.
func (cp *ControlPlane) AdminClient(tb testing.TB) kubernetes.Interface {
	tb.Helper()
	c, err := kubernetes.NewForConfig(cp.AdminConfig())
	if err != nil {
		tb.Fatal(err)
	}
	return c
}

func (cp *ControlPlane) restConfig(token string) *rest.Config {
	return &rest.Config{
		Host:            cp.Server,
		BearerToken:     token,
		TLSClientConfig: rest.TLSClientConfig{CAFile: cp.CAFile},
		Dial:            cp.dial,
		QPS:             -1, // tests create objects in bursts; no client-side throttling
		UserAgent:       "kup-controlplane-test",
	}
}

// ready reports whether /readyz answers ok.
func (cp *ControlPlane) ready() bool {
	if _, err := os.Stat(cp.CAFile); err != nil {
		return false // kube-apiserver writes its certificate before it listens
	}
	if cp.probe == nil {
		rt, err := rest.TransportFor(cp.AdminConfig())
		if err != nil {
			return false
		}
		cp.probe = &http.Client{Transport: rt, Timeout: 2 * time.Second}
	}
	resp, err := cp.probe.Get(cp.Server + "/readyz?verbose")
	if err != nil {
		cp.notReady = err.Error()
		return false
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 16<<10))
	if resp.StatusCode == http.StatusOK {
		return true
	}
	// The failed checks: which post-start hook or storage kept it from ready.
	var failed []string
	for _, line := range strings.Split(string(body), "\n") {
		if !strings.HasPrefix(line, "[+]") {
			failed = append(failed, line)
		}
	}
	cp.notReady = resp.Status + "\n" + strings.Join(failed, "\n")
	return false
}
