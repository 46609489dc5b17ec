package config

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/watchlist"
	"k8s.io/klog/v2"
)

// readyPollEvery is the first wait between /readyz probes while the API
// server is away; each wait doubles up to readyPollCap and is stretched by
// up to readyPollJitter (k8s.io/apimachinery's wait.Backoff). A short outage
// is seen to end within about 0.4 s, a long one within 3 s, plus one list.
// At a fixed 250 ms every node probed about 12 times a second (three
// informers), held to the client's QPS limit (5/s) for the whole outage, and
// all nodes, which lost the server together, relisted within the same
// 250 ms when it returned; kube-proxy's reflectors back off to 30 s instead,
// which is what the wait is for (see patientListWatch).
const readyPollEvery = 250 * time.Millisecond

// readyPollCap bounds the wait between probes (before its jitter).
const readyPollCap = 2 * time.Second

// readyPollJitter stretches each wait by up to this fraction, so that nodes
// that lost the server together spread their probes and their relists.
const readyPollJitter = 0.5

// readyMaxWait spaces the calls made while waiting for readiness: /readyz is
// only a hint. A server can serve lists while one of its readiness checks
// fails (500), or answer /readyz slower than the probe's timeout; the call
// itself, tried this often, ends the wait when it succeeds.
const readyMaxWait = 10 * time.Second

// readyProbeTimeout bounds one /readyz request.
const readyProbeTimeout = 2 * time.Second

// refusedRetryEvery spaces the calls while the API server refuses them
// (401/403): right after its restart a server answers before its RBAC is
// loaded, and the refusal passes within seconds.
const refusedRetryEvery = time.Second

// refusedPatience bounds the retries of a refusal (401/403): one that
// outlasts an API server's restart (a missing RBAC grant) is the
// reflector's to handle, as it is at once for kube-proxy's. The reflector
// then lists again (a refused watch-list falls back to a plain list) and
// backs off, so a ServiceAccount that may list but not watch gets a view
// that each relist brings up to date, as kube-proxy does, instead of the
// first list's for good. A var: tests shorten it.
var refusedPatience = 30 * time.Second

// stillFailingLogEvery spaces the error lines of a wait that goes on (a
// grant that is missing, a certificate that does not verify).
const stillFailingLogEvery = 30 * time.Second

// readyProbe reports whether the API server answers requests again.
type readyProbe func(ctx context.Context) bool

// apiServerReady probes /readyz (readable without any grant through
// system:public-info-viewer). A refusal (401/403) is an answer too: the server
// is up and the reflector's own error handling applies; so is 404, from a
// front proxy that forwards only /api and /apis. A client without a REST
// client (the fake clientset) is always ready.
func apiServerReady(client kubernetes.Interface) readyProbe {
	rc := client.Discovery().RESTClient()
	if rc == nil {
		return func(context.Context) bool { return true }
	}
	return func(ctx context.Context) bool {
		ctx, cancel := context.WithTimeout(ctx, readyProbeTimeout)
		defer cancel()
		var code int
		rc.Get().AbsPath("/readyz").Do(ctx).StatusCode(&code)
		switch code {
		case http.StatusOK, http.StatusUnauthorized, http.StatusForbidden, http.StatusNotFound:
			return true
		}
		return false
	}
}

// patientListWatch keeps a reflector out of its backoff while the API server
// is away. client-go's reflectors (not configurable through shared informers)
// retry a failed list or watch after 800 ms doubling to a 30 s cap, each
// stretched by up to 2×: after a 30 s outage the next attempt could be a
// minute away. Here a failed call first asks whether the server is ready; if
// it is not, the call waits until /readyz answers and is made once more, so
// the reflector sees a late success instead of an error to back off from.
// Errors from a server that is ready are the reflector's to handle as usual.
//
// A refusal (401/403) from a ready server is retried here too, every
// refusedRetryEvery: after a restart the server refuses until its RBAC is
// loaded, and a refusal handed to the reflector started a backoff that
// held the informer back up to a minute after it passed (six restarts in a
// row: endpoints served 44-60 s late). A refusal that lasts refusedPatience
// (a missing grant) is handed to the reflector, logged as an error, and so
// is every refusal after it until a call of the same verb (list, watch) is
// allowed: the reflector's backoff spaces them then, as kube-proxy's. Each
// call that began a new window of retries kept a node refused for good at
// a call a second.
type patientListWatch struct {
	inner cache.ListerWatcherWithContext
	// unsupported is the inner ListerWatcher's watch-list capability, kept
	// so that wrapping does not change which list protocol the reflector uses.
	unsupported bool
	// probes tells whether the API server is ready: the source's one
	// stream of /readyz probes, shared by its informers.
	probes *readiness
	what   string
	// failed (nil: nothing) is told every failed call.
	failed func(error)
	// listHandedOver and watchHandedOver are set when a refusal outlasted
	// refusedFor and went to the reflector, and each is cleared by the next
	// call of its verb allowed: a grant of list without watch has each
	// reflector cycle list (allowed) then watch, and an allowed list that
	// cleared the watch's began 30 s more of watch retries every second
	// at each cycle.
	listHandedOver, watchHandedOver atomic.Bool
	// hungSaid: a hung call to a server whose probe fails was said
	// (raced), and no call succeeded since: through a long outage each
	// retry's call hangs again, and it was said at each.
	hungSaid atomic.Bool
	// maxWait is readyMaxWait, refusedEvery refusedRetryEvery, refusedFor
	// refusedPatience, logEvery stillFailingLogEvery and hungAfter
	// readyProbeTimeout; tests shorten them.
	maxWait, refusedEvery, refusedFor, logEvery, hungAfter time.Duration
}

func newPatientListWatch(lw cache.ListerWatcher, probes *readiness, what string) *patientListWatch {
	return &patientListWatch{
		inner:        cache.ToListerWatcherWithContext(lw),
		unsupported:  watchlist.DoesClientNotSupportWatchListSemantics(lw),
		probes:       probes,
		what:         what,
		maxWait:      readyMaxWait,
		refusedEvery: refusedRetryEvery,
		refusedFor:   refusedPatience,
		logEvery:     stillFailingLogEvery,
		hungAfter:    readyProbeTimeout,
	}
}

func (p *patientListWatch) ListWithContext(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
	return patiently(ctx, p, &p.listHandedOver, func() (runtime.Object, error) {
		return raced(ctx, p, func(ctx context.Context) (runtime.Object, error) { return p.inner.ListWithContext(ctx, opts) },
			func(list runtime.Object, done context.CancelFunc) runtime.Object { done(); return list }, nil)
	})
}

// watchRaced is the inner watch, made by raced; the watch's context lives
// until it is stopped.
func (p *patientListWatch) watchRaced(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
	return raced(ctx, p, func(ctx context.Context) (watch.Interface, error) { return p.inner.WatchWithContext(ctx, opts) },
		func(w watch.Interface, done context.CancelFunc) watch.Interface { return cancelOnStop{w, done} },
		func(w watch.Interface) { w.Stop() })
}

// cancelOnStop ends a watch's context with the watch.
type cancelOnStop struct {
	watch.Interface
	cancel context.CancelFunc
}

func (w cancelOnStop) Stop() {
	w.Interface.Stop()
	w.cancel()
}

// WatchWithContext's watch goes on across the ends of its streams (see
// resumableWatch), so that the reflector does not back off at each.
func (p *patientListWatch) WatchWithContext(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
	w, err := p.patientWatch(ctx, opts)
	if err != nil || w == nil {
		return w, err
	}
	resume := func(ctx context.Context, rv string) (watch.Interface, error) {
		o := opts
		o.ResourceVersion, o.ResourceVersionMatch, o.SendInitialEvents, o.AllowWatchBookmarks = rv, "", nil, true
		return p.patientWatch(ctx, o)
	}
	// A resume the server cannot serve (410) streams every object again, as
	// the watch-list the reflector began with did.
	var relist func(ctx context.Context, rv string) (watch.Interface, error)
	if opts.SendInitialEvents != nil && *opts.SendInitialEvents {
		relist = func(ctx context.Context, rv string) (watch.Interface, error) {
			o := opts
			o.ResourceVersion, o.ResourceVersionMatch, o.AllowWatchBookmarks = rv, metav1.ResourceVersionMatchNotOlderThan, true
			return p.patientWatch(ctx, o)
		}
	}
	return newResumableWatch(ctx, w, opts, p.what, resume, relist), nil
}

// patientWatch is one inner watch, made patiently and raced.
func (p *patientListWatch) patientWatch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
	return patiently(ctx, p, &p.watchHandedOver, func() (watch.Interface, error) { return p.watchRaced(ctx, opts) })
}

// List and Watch complete cache.ListerWatcher; reflectors call the context forms.
func (p *patientListWatch) List(opts metav1.ListOptions) (runtime.Object, error) {
	return p.ListWithContext(context.Background(), opts)
}

func (p *patientListWatch) Watch(opts metav1.ListOptions) (watch.Interface, error) {
	return p.WatchWithContext(context.Background(), opts)
}

// IsWatchListSemanticsUnSupported forwards the inner capability (see
// k8s.io/client-go/util/watchlist).
func (p *patientListWatch) IsWatchListSemanticsUnSupported() bool { return p.unsupported }

// patiently makes call; when it fails and the server is not ready, it
// waits for readiness and makes it once more, returning that result. The
// probe is only a hint: every maxWait of waiting the call itself is tried
// again, and its success ends the wait, so no probe answer can stall an
// informer, and a long outage never reaches the reflector's backoff.
// It returns the last error when ctx ends.
// handedOver is the call's verb's refusal hand-over (untilAllowed).
func patiently[T any](ctx context.Context, p *patientListWatch, handedOver *atomic.Bool, call func() (T, error)) (T, error) {
	inner := call
	call = func() (T, error) {
		v, err := inner()
		switch {
		case err == nil:
			handedOver.Store(false) // a lasting refusal has passed
			p.hungSaid.Store(false) // an outage has passed
		case p.failed != nil && ctx.Err() == nil:
			p.failed(err)
		}
		return v, err
	}
	v, err := call()
	if err == nil || ctx.Err() != nil {
		return v, err // a stop is not an outage
	}
	if refused(err) {
		return untilAllowed(ctx, p, handedOver, call, err)
	}
	if p.probes.now(ctx) {
		return v, err
	}
	began, logged := time.Now(), time.Now()
	switch {
	case badCertificate(err):
		// Not an outage that passes: the kubeconfig's CA or server name.
		klog.ErrorS(err, "API server's certificate does not verify: check the certificate authority (the kubeconfig's, or the service account's ca.crt in a pod) and the server name (--master); retrying", "informer", p.what)
	case SentPlainHTTP(err):
		// Nor this: the address, which /readyz, refused the same way, cannot pass.
		klog.ErrorS(err, "API server speaks HTTPS and was sent plain HTTP: its address has no https:// (--master HOST:PORT without a scheme is taken as http://, as by client-go); write --master https://HOST:PORT, or the kubeconfig's server so; retrying", "informer", p.what)
	default:
		klog.InfoS("API server not ready; waiting for it before retrying", "informer", p.what, "err", err)
	}
	answers, done := p.probes.wait()
	defer done()
	retry := time.NewTimer(p.maxWait)
	defer retry.Stop()
	for {
		select {
		case <-ctx.Done():
			return v, err
		case ready := <-answers:
			if !ready {
				continue
			}
			klog.InfoS("API server ready again; retrying at once", "informer", p.what, "waited", time.Since(began).Round(time.Millisecond))
			// A server back from a restart is ready before its
			// authorizer has loaded: refusals then are passing too,
			// and the reflector's backoff made changes 1-14 s late.
			if v, err = call(); err != nil && refused(err) && ctx.Err() == nil {
				v, err = untilAllowed(ctx, p, handedOver, call, err)
			}
			return v, err
		case <-retry.C:
		}
		if v, err = call(); err == nil {
			klog.InfoS("API server answered while its readiness probe did not", "informer", p.what, "waited", time.Since(began).Round(time.Millisecond))
			return v, nil
		}
		if refused(err) && ctx.Err() == nil {
			return untilAllowed(ctx, p, handedOver, call, err)
		}
		retry.Reset(p.maxWait)
		if time.Since(logged) >= p.logEvery && ctx.Err() == nil {
			msg := "API server still unreachable; retrying"
			switch { // not an outage: said as the first line said it
			case badCertificate(err):
				msg = "API server's certificate still does not verify; retrying"
			case SentPlainHTTP(err):
				msg = "API server still sent plain HTTP: its address wants https://; retrying"
			}
			klog.ErrorS(err, msg, "informer", p.what, "waited", time.Since(began).Round(time.Second))
			logged = time.Now()
		}
	}
}

// raced makes call with a context of its own. A call not answered within
// hungAfter is watched: readiness is checked then, and followed from then on
// through the source's one stream of probes (readiness; a server that is up
// while its lists hang, etcd away, answers every probe), and when a probe
// failed and a later one succeeds, the server came back while the call hung
// (a connection into a path that drops packets, a load balancer without a
// backend, a firewall's DROP, waits out client-go's 30 s dial timeout), so
// the call is abandoned and made anew: it waited up to 30 s past the
// server's return, and the waits of patiently, made between such calls,
// missed it. A slow call to a server that stays ready is left alone; each
// abandon doubles the wait before the next call is watched, so that a slow
// call to a server whose /readyz flaps (a health check timing out under
// load, when lists are slow too) is let finish after a few. kept
// gets a successful call's value and the function that ends its context
// (at once for a list, when a watch stops); drop gets the value an abandoned
// call returned anyway.
func raced[T any](ctx context.Context, p *patientListWatch, call func(context.Context) (T, error),
	kept func(T, context.CancelFunc) T, drop func(T)) (T, error) {
	type result struct {
		v   T
		err error
	}
	hungAfter := p.hungAfter
	for {
		cctx, cancel := context.WithCancel(ctx)
		done := make(chan result, 1)
		go func() {
			v, err := call(cctx)
			done <- result{v, err}
		}()
		// Once the call is hung: one probe at once (checked), then the
		// source's stream (answers); both nil until then.
		var checked, answers <-chan bool
		stopWaiting := func() {}
		timer := time.NewTimer(hungAfter)
		began, down, abandoned := time.Now(), false, false
		var r result
	wait:
		for {
			var ready bool
			select {
			case r = <-done:
				break wait
			case <-timer.C:
				check := make(chan bool, 1)
				go func() { check <- p.probes.now(cctx) }()
				checked = check
				answers, stopWaiting = p.probes.wait()
				continue
			case ready = <-checked:
				checked = nil
			case ready = <-answers:
			}
			if !ready {
				if !down && !p.hungSaid.Swap(true) {
					// Said once an outage: an API server that takes
					// connections and answers nothing (stopped, a load
					// balancer without a backend) left "Waiting for caches
					// to sync" the last line for as long as it lasted.
					klog.InfoS("API server does not answer: a call has hung and its readiness probe fails; waiting for it", "informer", p.what, "waited", time.Since(began).Round(time.Millisecond))
				}
				down = true
			} else if down {
				abandoned = true
				break wait
			}
		}
		timer.Stop() // a check still out writes into its buffered channel and ends
		stopWaiting()
		if !abandoned {
			if r.err != nil {
				cancel()
				return r.v, r.err
			}
			return kept(r.v, cancel), nil
		}
		klog.InfoS("API server ready again while a call to it hung; making it anew", "informer", p.what)
		hungAfter *= 2
		cancel()
		go func() {
			if r := <-done; r.err == nil && drop != nil {
				drop(r.v)
			}
		}()
	}
}

// untilAllowed retries a refused call every refusedEvery until it is
// allowed, fails otherwise, ctx ends, or the refusal has lasted
// refusedFor: then the refusal is the reflector's (see refusedPatience),
// and so are the next refusals of either verb, each until a call of its
// verb (handedOver) is allowed.
func untilAllowed[T any](ctx context.Context, p *patientListWatch, handedOver *atomic.Bool, call func() (T, error), err error) (T, error) {
	var v T
	if handedOver.Load() {
		return v, err // the same refusal, the reflector's since it lasted
	}
	began, logged := time.Now(), time.Now()
	klog.ErrorS(err, "API server refused the informer; retrying every second (a server that just restarted, or "+refusalCause(err)+")", "informer", p.what)
	tick := time.NewTicker(p.refusedEvery)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return v, err
		case <-tick.C:
		}
		if v, err = call(); err == nil {
			klog.InfoS("API server allows the informer again", "informer", p.what, "waited", time.Since(began).Round(time.Millisecond))
			return v, nil
		}
		if !refused(err) {
			return v, err // the reflector's (or the next call's) to handle
		}
		if time.Since(began) >= p.refusedFor {
			klog.ErrorS(err, "API server still refuses the informer ("+refusalCause(err)+"?): it lists again and retries, backing off, as kube-proxy's informers do; with list allowed but not watch, the lists alone keep it up to date", "informer", p.what, "waited", time.Since(began).Round(time.Second))
			// Both verbs: the reflector's next call after a refused
			// watch-list is its fallback list, refused too when nothing
			// is granted; only a call allowed clears its own verb's.
			p.listHandedOver.Store(true)
			p.watchHandedOver.Store(true)
			return v, err
		}
		if time.Since(logged) >= p.logEvery {
			klog.ErrorS(err, "API server still refuses the informer; retrying", "informer", p.what, "waited", time.Since(began).Round(time.Second))
			logged = time.Now()
		}
	}
}

// refusalCause is what a lasting refusal suggests: a 403 a missing RBAC
// grant; a 401 the credentials, never RBAC (kube-apiserver's 401 says
// only "Unauthorized"; an expired client certificate or a revoked token
// was logged as "a missing RBAC grant").
func refusalCause(err error) string {
	if apierrors.IsUnauthorized(err) {
		return "credentials it does not accept: a token expired or revoked, a client certificate expired or not signed by its client CA"
	}
	return "a missing RBAC grant"
}

// refused reports a 401 or 403.
func refused(err error) bool {
	return apierrors.IsForbidden(err) || apierrors.IsUnauthorized(err)
}

// badCertificate reports a server certificate that does not verify.
func badCertificate(err error) bool {
	var verify *tls.CertificateVerificationError
	var unknown x509.UnknownAuthorityError
	var host x509.HostnameError
	var invalid x509.CertificateInvalidError
	return errors.As(err, &verify) || errors.As(err, &unknown) || errors.As(err, &host) || errors.As(err, &invalid)
}

// SentPlainHTTP reports an HTTPS server's answer to plain HTTP: Go's
// servers, kube-apiserver's included, answer 400 "Client sent an HTTP
// request to an HTTPS server.", and an nginx terminating TLS in front of
// one 400 "The plain HTTP request was sent to HTTPS port", which client-go
// words as "the server rejected our request for an unknown reason",
// keeping the body (a text one) as the cause. Plain HTTP is right for
// some servers (kubectl proxy), so only the answer tells.
func SentPlainHTTP(err error) bool {
	var status apierrors.APIStatus
	if !errors.As(err, &status) || status.Status().Code != http.StatusBadRequest || status.Status().Details == nil {
		return false
	}
	for _, c := range status.Status().Details.Causes {
		if strings.Contains(c.Message, "HTTP request to an HTTPS server") || strings.Contains(c.Message, "plain HTTP request was sent to HTTPS port") {
			return true
		}
	}
	return false
}

// patientInformer returns the factory's informer for obj built over a
// patientListWatch of list and watch (options tweaked as the factory's are).
func patientInformer(factory informers.SharedInformerFactory, client kubernetes.Interface, probes *readiness, failed func(error),
	obj runtime.Object, what string, tweak func(*metav1.ListOptions),
	list func(context.Context, metav1.ListOptions) (runtime.Object, error),
	watchFn func(context.Context, metav1.ListOptions) (watch.Interface, error)) cache.SharedIndexInformer {
	return factory.InformerFor(obj, func(_ kubernetes.Interface, resync time.Duration) cache.SharedIndexInformer {
		lw := cache.ToListWatcherWithWatchListSemantics(&cache.ListWatch{
			ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
				tweak(&o)
				return list(ctx, o)
			},
			WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
				tweak(&o)
				return watchFn(ctx, o)
			},
		}, client)
		plw := newPatientListWatch(lw, probes, what)
		plw.failed = failed
		return cache.NewSharedIndexInformerWithOptions(plw, obj,
			cache.SharedIndexInformerOptions{
				ResyncPeriod: resync,
				Indexers:     cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc},
			})
	})
}

func serviceInformer(f informers.SharedInformerFactory, c kubernetes.Interface, probes *readiness, failed func(error), tweak func(*metav1.ListOptions)) cache.SharedIndexInformer {
	return patientInformer(f, c, probes, failed, &v1.Service{}, "services", tweak,
		func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			return c.CoreV1().Services(metav1.NamespaceAll).List(ctx, o)
		},
		func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			return c.CoreV1().Services(metav1.NamespaceAll).Watch(ctx, o)
		})
}

func sliceInformer(f informers.SharedInformerFactory, c kubernetes.Interface, probes *readiness, failed func(error), tweak func(*metav1.ListOptions)) cache.SharedIndexInformer {
	return patientInformer(f, c, probes, failed, &discoveryv1.EndpointSlice{}, "endpointslices", tweak,
		func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			return c.DiscoveryV1().EndpointSlices(metav1.NamespaceAll).List(ctx, o)
		},
		func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			return c.DiscoveryV1().EndpointSlices(metav1.NamespaceAll).Watch(ctx, o)
		})
}

func nodeInformer(f informers.SharedInformerFactory, c kubernetes.Interface, probes *readiness, failed func(error), tweak func(*metav1.ListOptions)) cache.SharedIndexInformer {
	return patientInformer(f, c, probes, failed, &v1.Node{}, "node", tweak,
		func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			return c.CoreV1().Nodes().List(ctx, o)
		},
		func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			return c.CoreV1().Nodes().Watch(ctx, o)
		})
}
