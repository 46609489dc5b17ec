package config

import (
	"context"
	"crypto/x509"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/internal/lockedbuf"
)

var watchForbidden = apierrors.NewForbidden(schema.GroupResource{Group: "discovery.k8s.io", Resource: "endpointslices"}, "",
	errors.New(`cannot watch resource "endpointslices" in API group "discovery.k8s.io" at the cluster scope`))

// TestPatientListWatchHandsOverLastingRefusal: a refusal that outlasts an
// API server's restart (a missing RBAC grant) goes to the reflector after
// refusedFor, as kube-proxy's reflectors get it at once: the reflector then
// lists again (a refused watch-list falls back to a plain list), so a
// ServiceAccount that may list but not watch still gets a view kept
// current by relists. Retried here for good, the informer kept the view
// of its last list forever.
func TestPatientListWatchHandsOverLastingRefusal(t *testing.T) {
	inner := &cache.ListWatch{WatchFuncWithContext: func(context.Context, metav1.ListOptions) (watch.Interface, error) {
		return nil, watchForbidden
	}}
	p := newPatientListWatch(inner, newReadiness(func(context.Context) bool { return true }), "endpointslices")
	p.refusedEvery = 5 * time.Millisecond
	p.refusedFor = 50 * time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	start := time.Now()
	if _, err := p.WatchWithContext(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) || ctx.Err() != nil {
		t.Fatalf("a lasting refusal: err %v after %v (context: %v), want the refusal handed over after refusedFor", err, time.Since(start), ctx.Err())
	}
}

// A refusal handed to the reflector stays the reflector's until a call is
// allowed: the reflector's next calls, refused the same, return at once and
// its backoff spaces them, as kube-proxy's. Each began 30 s more of retries
// every second, so a node without its RBAC grant sent 3 refused requests a
// second for good while its log said it backed off. Once a call is allowed,
// a later refusal (an API server restarting) is retried again.
func TestPatientListWatchLastingRefusalStaysHandedOver(t *testing.T) {
	var calls atomic.Int32
	var allow atomic.Bool
	inner := &cache.ListWatch{WatchFuncWithContext: func(context.Context, metav1.ListOptions) (watch.Interface, error) {
		calls.Add(1)
		if allow.Load() {
			return watch.NewEmptyWatch(), nil
		}
		return nil, watchForbidden
	}}
	p := newPatientListWatch(inner, newReadiness(func(context.Context) bool { return true }), "endpointslices")
	p.refusedEvery = 5 * time.Millisecond
	p.refusedFor = 50 * time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	watchOnce := func() (int32, error) {
		calls.Store(0)
		w, err := p.patientWatch(ctx, metav1.ListOptions{})
		if w != nil {
			w.Stop()
		}
		return calls.Load(), err
	}
	if n, err := watchOnce(); !apierrors.IsForbidden(err) || n < 2 {
		t.Fatalf("first refusal: %d calls, err %v; want it retried, then handed over", n, err)
	}
	for i := range 3 {
		if n, err := watchOnce(); !apierrors.IsForbidden(err) || n != 1 {
			t.Fatalf("the reflector's call %d after the handover: %d calls to the API server, err %v; want 1, refused at once", i+1, n, err)
		}
	}
	allow.Store(true)
	if n, err := watchOnce(); err != nil || n != 1 {
		t.Fatalf("allowed: %d calls, err %v", n, err)
	}
	allow.Store(false)
	if n, err := watchOnce(); !apierrors.IsForbidden(err) || n < 2 {
		t.Fatalf("a refusal after an allowed call: %d calls, err %v; want it retried again", n, err)
	}
}

// TestPatientListWatchWatchRefusalStaysHandedOverAcrossLists: a grant of
// list without watch. The reflector's cycle is a refused watch-list, a
// plain list (allowed), a refused watch, its backoff: the allowed list
// cleared the watch's hand-over, so each watch began 30 s more of
// retries every second (about 60 refused requests per cycle and informer,
// where kube-proxy's reflectors send 2). A refusal stays handed over
// until a call of its own verb is allowed.
func TestPatientListWatchWatchRefusalStaysHandedOverAcrossLists(t *testing.T) {
	var watches atomic.Int32
	inner := &cache.ListWatch{
		ListWithContextFunc: func(context.Context, metav1.ListOptions) (runtime.Object, error) { return &metav1.List{}, nil },
		WatchFuncWithContext: func(context.Context, metav1.ListOptions) (watch.Interface, error) {
			watches.Add(1)
			return nil, watchForbidden
		},
	}
	p := newPatientListWatch(inner, newReadiness(func(context.Context) bool { return true }), "endpointslices")
	p.refusedEvery = 5 * time.Millisecond
	p.refusedFor = 50 * time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := p.patientWatch(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) || watches.Load() < 2 {
		t.Fatalf("first refusal: %d watches, err %v; want it retried, then handed over", watches.Load(), err)
	}
	for i := range 3 {
		if _, err := p.ListWithContext(ctx, metav1.ListOptions{}); err != nil {
			t.Fatalf("list %d: %v", i+1, err)
		}
		watches.Store(0)
		if _, err := p.patientWatch(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) || watches.Load() != 1 {
			t.Fatalf("the reflector's watch %d after an allowed list: %d watches to the API server, err %v; want 1, refused at once", i+1, watches.Load(), err)
		}
	}
	// Neither granted: the watch-list's lasting refusal hands the list
	// over too (the reflector's fallback list), not 30 s more of retries.
	var lists atomic.Int32
	inner.ListWithContextFunc = func(context.Context, metav1.ListOptions) (runtime.Object, error) {
		lists.Add(1)
		return nil, listForbidden
	}
	q := newPatientListWatch(inner, newReadiness(func(context.Context) bool { return true }), "endpointslices")
	q.refusedEvery, q.refusedFor = 5*time.Millisecond, 50*time.Millisecond
	if _, err := q.patientWatch(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Fatalf("nothing granted, the watch-list: err %v, want the refusal handed over", err)
	}
	if _, err := q.ListWithContext(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) || lists.Load() != 1 {
		t.Fatalf("nothing granted, the fallback list after the watch-list was handed over: %d lists, err %v; want 1, refused at once", lists.Load(), err)
	}
}

var listForbidden = apierrors.NewForbidden(schema.GroupResource{Group: "discovery.k8s.io", Resource: "endpointslices"}, "",
	errors.New(`cannot list resource "endpointslices" in API group "discovery.k8s.io" at the cluster scope`))

// An API server that takes connections and answers nothing (stopped, a load
// balancer without a backend) is said once a call has hung and the readiness
// probe fails too: "Waiting for caches to sync" stayed the last line (50 s of
// a stopped kube-apiserver, /healthz 503, nothing said).
func TestHungCallToAnAbsentServerIsSaid(t *testing.T) {
	captureKlog(t)
	logs := &lockedbuf.Buffer{}
	klog.SetOutput(logs)
	inner := &cache.ListWatch{ListWithContextFunc: func(ctx context.Context, _ metav1.ListOptions) (runtime.Object, error) {
		<-ctx.Done() // taken, never answered
		return nil, ctx.Err()
	}}
	p := newPatientListWatch(inner, newReadiness(func(context.Context) bool { return false }), "services")
	p.hungAfter, p.probes.every = 10*time.Millisecond, 5*time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = p.ListWithContext(ctx, metav1.ListOptions{})
	}()
	defer func() { cancel(); <-done }()
	deadline := time.Now().Add(5 * time.Second)
	for klog.Flush(); !strings.Contains(logs.String(), `"API server does not answer: a call has hung and its readiness probe fails; waiting for it" informer="services"`); klog.Flush() {
		if time.Now().After(deadline) {
			t.Fatalf("a hung list to a server whose probe fails: nothing said after 5 s:\n%s", logs.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestHungCallsOfOneOutageSaidOnce: through a long outage of an API server
// that takes connections and answers nothing, each retry's call hangs
// again (a TLS handshake that times out after 10 s, made anew every
// readyMaxWait): "does not answer" was said at each, about every 20 s per
// informer for as long as the outage lasted, where the other lines of an
// outage are said every stillFailingLogEvery. Said once until a call
// succeeds.
func TestHungCallsOfOneOutageSaidOnce(t *testing.T) {
	captureKlog(t)
	logs := &lockedbuf.Buffer{}
	klog.SetOutput(logs)
	var calls atomic.Int32
	inner := &cache.ListWatch{ListWithContextFunc: func(ctx context.Context, _ metav1.ListOptions) (runtime.Object, error) {
		calls.Add(1)
		select { // hangs past hungAfter, then times out
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(30 * time.Millisecond):
			return nil, errors.New("net/http: TLS handshake timeout")
		}
	}}
	p := newPatientListWatch(inner, newReadiness(func(context.Context) bool { return false }), "services")
	p.hungAfter, p.probes.every, p.maxWait, p.logEvery = 5*time.Millisecond, 2*time.Millisecond, 5*time.Millisecond, time.Hour
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = p.ListWithContext(ctx, metav1.ListOptions{})
	}()
	for deadline := time.Now().Add(10 * time.Second); calls.Load() < 5; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d calls after 10 s, want 5 retries", calls.Load())
		}
	}
	cancel()
	<-done
	klog.Flush()
	if n := strings.Count(logs.String(), "API server does not answer"); n != 1 {
		t.Fatalf("%d calls of one outage hung: said %d times, want once:\n%s", calls.Load(), n, logs.String())
	}
}

// TestInformerSourceListWithoutWatch: with list allowed and watch
// refused, changes still arrive, through the reflector's relists (as with
// kube-proxy); the first refused watch held the informer forever, and a
// slice added after the first list was never delivered.
func TestInformerSourceListWithoutWatch(t *testing.T) {
	saved := refusedPatience
	refusedPatience = 100 * time.Millisecond
	t.Cleanup(func() { refusedPatience = saved })
	client := fake.NewClientset(svcFixture("a"), sliceFixture("a-1", nil))
	client.PrependWatchReactor("endpointslices", func(k8stesting.Action) (bool, watch.Interface, error) {
		return true, nil, watchForbidden
	})
	r := newInformerRecorder()
	runInformerSource(t, client, InformerOptions{}, r)
	r.waitFor(t, "slices synced")
	if _, err := client.DiscoveryV1().EndpointSlices("ns").Create(context.Background(), sliceFixture("a-2", nil), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	r.waitFor(t, "slice add ns/a-2")
}

// A 401 is the credentials (a token revoked or expired, a client
// certificate expired), never RBAC: its log lines said "a missing RBAC
// grant", and kube-apiserver's 401 says only "Unauthorized", so an expired
// certificate sent the operator to the ClusterRole. A 403 keeps the RBAC
// hint.
func TestRefusalHintByCode(t *testing.T) {
	captureKlog(t)
	for _, tc := range []struct {
		name      string
		err       error
		want, not string
	}{
		{"401", apierrors.NewUnauthorized("Unauthorized"), "credentials", "RBAC"},
		{"403", watchForbidden, "RBAC", "credentials"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			logs := &lockedbuf.Buffer{}
			klog.SetOutput(logs)
			inner := &cache.ListWatch{WatchFuncWithContext: func(context.Context, metav1.ListOptions) (watch.Interface, error) {
				return nil, tc.err
			}}
			p := newPatientListWatch(inner, newReadiness(func(context.Context) bool { return true }), "services")
			p.refusedEvery = 5 * time.Millisecond
			p.refusedFor = 30 * time.Millisecond
			if _, err := p.WatchWithContext(context.Background(), metav1.ListOptions{}); err == nil {
				t.Fatal("a lasting refusal was not handed over")
			}
			klog.Flush()
			got := logs.String()
			if !strings.Contains(got, "refused the informer") || !strings.Contains(got, "still refuses the informer") {
				t.Fatalf("logs lack the refusal lines:\n%s", got)
			}
			if !strings.Contains(got, tc.want) || strings.Contains(got, tc.not) {
				t.Errorf("a %s: want %q named and not %q:\n%s", tc.name, tc.want, tc.not, got)
			}
		})
	}
}

// A server certificate that does not verify is said as such for as long
// as it lasts: the line every 30 s after the first said "API server still
// unreachable", as if it were an outage.
func TestBadCertificateStaysNamed(t *testing.T) {
	captureKlog(t)
	logs := &lockedbuf.Buffer{}
	klog.SetOutput(logs)
	badCert := &url.Error{Op: "Get", URL: "https://127.0.0.1:6443/api/v1/services", Err: x509.UnknownAuthorityError{}}
	inner := &cache.ListWatch{WatchFuncWithContext: func(context.Context, metav1.ListOptions) (watch.Interface, error) {
		return nil, badCert
	}}
	p := newPatientListWatch(inner, newReadiness(func(context.Context) bool { return false }), "services")
	p.maxWait, p.logEvery = time.Millisecond, time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), 700*time.Millisecond)
	defer cancel()
	_, _ = p.WatchWithContext(ctx, metav1.ListOptions{})
	klog.Flush()
	got := logs.String()
	if !strings.Contains(got, "certificate does not verify") || !strings.Contains(got, "certificate still does not verify") ||
		strings.Contains(got, "unreachable") {
		t.Errorf("want the certificate named in the first line and the next, not an outage:\n%s", got)
	}
}

// TestPlainHTTPToHTTPSIsNamed: --master HOST:PORT without a scheme is
// taken by client-go as http://, and kube-apiserver (Go's TLS server)
// answers plain HTTP with 400 "Client sent an HTTP request to an HTTPS
// server.". That was logged as an outage, "API server not ready" and then
// "still unreachable" every 30 s, for a server that answers: the line
// says that the address wants https://, the first time and after.
func TestPlainHTTPToHTTPSIsNamed(t *testing.T) {
	captureKlog(t)
	logs := &lockedbuf.Buffer{}
	klog.SetOutput(logs)
	srv := httptest.NewTLSServer(http.NotFoundHandler())
	defer srv.Close()
	cfg, err := BuildClientConfig("", srv.Listener.Addr().String()) // --master 127.0.0.1:PORT
	if err != nil {
		t.Fatal(err)
	}
	cfg.QPS = -1 // no client-side rate limit: the calls below come every few ms
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	inner := &cache.ListWatch{ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
		return client.CoreV1().Services("").List(ctx, o)
	}}
	p := newPatientListWatch(inner, newReadiness(apiServerReady(client)), "services")
	p.maxWait, p.logEvery = 10*time.Millisecond, 10*time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), 700*time.Millisecond)
	defer cancel()
	if _, err := p.ListWithContext(ctx, metav1.ListOptions{}); err == nil {
		t.Fatal("a list over plain HTTP to a TLS server succeeded")
	}
	klog.Flush()
	got := logs.String()
	if !strings.Contains(got, "sent plain HTTP") || !strings.Contains(got, "https://") || !strings.Contains(got, "still") ||
		strings.Contains(got, "unreachable") || strings.Contains(got, "not ready") {
		t.Errorf("want plain HTTP to an HTTPS server named in the first line and the next, not an outage:\n%s", got)
	}
}

// TestSentPlainHTTPBehindNginx: an nginx terminating TLS in front of the
// API server answers plain HTTP with its own 400 page, "The plain HTTP
// request was sent to HTTPS port", which was taken for an outage as any
// other 400 is; Go's answer (kube-apiserver's) is the other wording.
func TestSentPlainHTTPBehindNginx(t *testing.T) {
	const nginxPage = "<html>\r\n<head><title>400 The plain HTTP request was sent to HTTPS port</title></head>\r\n<body>\r\n" +
		"<center><h1>400 Bad Request</h1></center>\r\n<center>The plain HTTP request was sent to HTTPS port</center>\r\n<hr><center>nginx</center>\r\n</body>\r\n</html>\r\n"
	for _, tc := range []struct {
		name, contentType, body string
		want                    bool
	}{
		{"nginx", "text/html", nginxPage, true},
		{"Go's TLS server", "text/plain; charset=utf-8", "Client sent an HTTP request to an HTTPS server.\n", true},
		{"another 400", "text/plain", "bad request: no such thing\n", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", tc.contentType)
				w.WriteHeader(http.StatusBadRequest)
				_, _ = w.Write([]byte(tc.body))
			}))
			defer srv.Close()
			cfg, err := BuildClientConfig("", srv.URL)
			if err != nil {
				t.Fatal(err)
			}
			client, err := kubernetes.NewForConfig(cfg)
			if err != nil {
				t.Fatal(err)
			}
			_, err = client.CoreV1().Services("").List(context.Background(), metav1.ListOptions{})
			if err == nil || SentPlainHTTP(err) != tc.want {
				t.Errorf("SentPlainHTTP(%v) = %v, want %v", err, !tc.want, tc.want)
			}
		})
	}
}
