package config

import (
	"context"
	"net/http"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/watchlist"
	"k8s.io/klog/v2"
)

// readyPollEvery spaces the /readyz probes while the API server is away: a
// resync is at most this much (plus one list) behind the server's return.
const readyPollEvery = 250 * time.Millisecond

// readyMaxWait bounds one wait for readiness: /readyz is only a hint. A
// server can serve lists while one of its readiness checks fails (500), or
// answer /readyz slower than the probe's timeout; after this long the call is
// made once more whatever the probe says, and a failure goes back to the
// reflector's own backoff, so no probe answer can stall an informer for good.
const readyMaxWait = 10 * time.Second

// readyProbeTimeout bounds one /readyz request.
const readyProbeTimeout = 2 * time.Second

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
type patientListWatch struct {
	inner cache.ListerWatcherWithContext
	// unsupported is the inner ListerWatcher's watch-list capability, kept
	// so that wrapping does not change which list protocol the reflector uses.
	unsupported bool
	ready       readyProbe
	what        string
	// maxWait is readyMaxWait; tests shorten it.
	maxWait time.Duration
}

func newPatientListWatch(lw cache.ListerWatcher, ready readyProbe, what string) *patientListWatch {
	return &patientListWatch{
		inner:       cache.ToListerWatcherWithContext(lw),
		unsupported: watchlist.DoesClientNotSupportWatchListSemantics(lw),
		ready:       ready,
		what:        what,
		maxWait:     readyMaxWait,
	}
}

func (p *patientListWatch) ListWithContext(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
	obj, err := p.inner.ListWithContext(ctx, opts)
	if err != nil && p.awaitReady(ctx, err) {
		return p.inner.ListWithContext(ctx, opts)
	}
	return obj, err
}

func (p *patientListWatch) WatchWithContext(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
	w, err := p.inner.WatchWithContext(ctx, opts)
	if err != nil && p.awaitReady(ctx, err) {
		return p.inner.WatchWithContext(ctx, opts)
	}
	return w, err
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

// awaitReady returns false at once when the server is ready (err stands);
// otherwise it waits for readiness, or at most maxWait, and returns true (try
// the call again), or false when ctx ends.
func (p *patientListWatch) awaitReady(ctx context.Context, err error) bool {
	if p.ready(ctx) {
		return false
	}
	began := time.Now()
	klog.InfoS("API server not ready; waiting for it before retrying", "informer", p.what, "err", err)
	tick := time.NewTicker(readyPollEvery)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return false
		case <-tick.C:
		}
		if p.ready(ctx) {
			klog.InfoS("API server ready again; retrying at once", "informer", p.what, "waited", time.Since(began).Round(time.Millisecond))
			return true
		}
		if waited := time.Since(began); waited >= p.maxWait {
			klog.InfoS("API server still not ready; retrying anyway", "informer", p.what, "waited", waited.Round(time.Millisecond))
			return true
		}
	}
}

// patientInformer returns the factory's informer for obj built over a
// patientListWatch of list and watch (options tweaked as the factory's are).
func patientInformer(factory informers.SharedInformerFactory, client kubernetes.Interface, ready readyProbe,
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
		return cache.NewSharedIndexInformerWithOptions(newPatientListWatch(lw, ready, what), obj,
			cache.SharedIndexInformerOptions{
				ResyncPeriod: resync,
				Indexers:     cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc},
			})
	})
}

func serviceInformer(f informers.SharedInformerFactory, c kubernetes.Interface, ready readyProbe, tweak func(*metav1.ListOptions)) cache.SharedIndexInformer {
	return patientInformer(f, c, ready, &v1.Service{}, "services", tweak,
		func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			return c.CoreV1().Services(metav1.NamespaceAll).List(ctx, o)
		},
		func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			return c.CoreV1().Services(metav1.NamespaceAll).Watch(ctx, o)
		})
}

func sliceInformer(f informers.SharedInformerFactory, c kubernetes.Interface, ready readyProbe, tweak func(*metav1.ListOptions)) cache.SharedIndexInformer {
	return patientInformer(f, c, ready, &discoveryv1.EndpointSlice{}, "endpointslices", tweak,
		func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			return c.DiscoveryV1().EndpointSlices(metav1.NamespaceAll).List(ctx, o)
		},
		func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			return c.DiscoveryV1().EndpointSlices(metav1.NamespaceAll).Watch(ctx, o)
		})
}

func nodeInformer(f informers.SharedInformerFactory, c kubernetes.Interface, ready readyProbe, tweak func(*metav1.ListOptions)) cache.SharedIndexInformer {
	return patientInformer(f, c, ready, &v1.Node{}, "node", tweak,
		func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			return c.CoreV1().Nodes().List(ctx, o)
		},
		func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			return c.CoreV1().Nodes().Watch(ctx, o)
		})
}
