package config

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"sync/atomic"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
)

// TestPatientListWatch: a call that fails while the API server is not ready waits for
// readiness and is retried once; a failure from a ready server is returned as is.
func TestPatientListWatch(t *testing.T) {
	errDown := errors.New("connection refused")
	for _, tt := range []struct {
		name       string
		notReady   int32 // probes that answer "not ready" before "ready"
		failures   int32 // inner calls that fail before one succeeds
		wantErr    bool
		wantCalls  int32
		wantProbes int32
	}{
		{"success needs no probe", 0, 0, false, 1, 0},
		{"ready server: its error stands", 0, 1, true, 1, 1},
		{"outage: waits for readiness, then retries once", 3, 1, false, 2, 4},
		{"retry fails too: that error is returned", 2, 2, true, 2, 3},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var calls, probes atomic.Int32
			inner := &cache.ListWatch{
				ListWithContextFunc: func(context.Context, metav1.ListOptions) (runtime.Object, error) {
					if calls.Add(1) <= tt.failures {
						return nil, errDown
					}
					return &v1.ServiceList{}, nil
				},
				WatchFuncWithContext: func(context.Context, metav1.ListOptions) (watch.Interface, error) {
					if calls.Add(1) <= tt.failures {
						return nil, errDown
					}
					return watch.NewFake(), nil
				},
			}
			ready := func(context.Context) bool { return probes.Add(1) > tt.notReady }
			p := newPatientListWatch(inner, newReadiness(ready), "test")
			p.probes.cap = p.probes.every // the count of probes is the point, not their spacing
			for _, call := range []struct {
				what string
				do   func() error
			}{
				{"list", func() error { _, err := p.ListWithContext(context.Background(), metav1.ListOptions{}); return err }},
				{"watch", func() error { _, err := p.WatchWithContext(context.Background(), metav1.ListOptions{}); return err }},
			} {
				calls.Store(0)
				probes.Store(0)
				err := call.do()
				if (err != nil) != tt.wantErr {
					t.Errorf("%s: err %v, want error %v", call.what, err, tt.wantErr)
				}
				if calls.Load() != tt.wantCalls || probes.Load() != tt.wantProbes {
					t.Errorf("%s: %d calls and %d probes, want %d and %d", call.what, calls.Load(), probes.Load(), tt.wantCalls, tt.wantProbes)
				}
			}
		})
	}
}

// TestPatientListWatchStops: a wait for readiness ends with its context.
func TestPatientListWatchStops(t *testing.T) {
	inner := &cache.ListWatch{ListWithContextFunc: func(context.Context, metav1.ListOptions) (runtime.Object, error) {
		return nil, errors.New("connection refused")
	}}
	p := newPatientListWatch(inner, newReadiness(func(context.Context) bool { return false }), "test")
	ctx, cancel := context.WithTimeout(context.Background(), 3*readyPollEvery)
	defer cancel()
	done := make(chan error, 1)
	go func() { _, err := p.ListWithContext(ctx, metav1.ListOptions{}); done <- err }()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("list succeeded without a server")
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the wait did not end with its context")
	}
}

// TestPatientListWatchWaitIsBounded: /readyz is a hint; a probe that never
// says ready (a failing readiness check on a server that still serves lists)
// delays the retry by at most maxWait instead of stalling the informer for good.
func TestPatientListWatchWaitIsBounded(t *testing.T) {
	var calls atomic.Int32
	inner := &cache.ListWatch{ListWithContextFunc: func(context.Context, metav1.ListOptions) (runtime.Object, error) {
		if calls.Add(1) == 1 {
			return nil, errors.New("the server is currently unable to handle the request")
		}
		return &v1.ServiceList{}, nil
	}}
	p := newPatientListWatch(inner, newReadiness(func(context.Context) bool { return false }), "test")
	p.maxWait = 2 * readyPollEvery
	done := make(chan error, 1)
	go func() { _, err := p.ListWithContext(context.Background(), metav1.ListOptions{}); done <- err }()
	select {
	case err := <-done:
		if err != nil || calls.Load() != 2 {
			t.Fatalf("after the bounded wait: err %v after %d calls, want the retry's success", err, calls.Load())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("a probe that never says ready stalled the list")
	}
}

// TestAPIServerReadyAnswers: any answer that shows the server is there counts
// as ready (the reflector then handles the call's own error); only a failing
// readiness check (5xx) or no answer at all makes the call wait.
func TestAPIServerReadyAnswers(t *testing.T) {
	for _, tt := range []struct {
		code  int
		ready bool
	}{
		{http.StatusOK, true},
		{http.StatusUnauthorized, true},
		{http.StatusForbidden, true},
		{http.StatusNotFound, true}, // a front proxy that forwards only /api and /apis
		{http.StatusInternalServerError, false},
		{http.StatusServiceUnavailable, false},
	} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(tt.code)
		}))
		client, err := kubernetes.NewForConfig(&rest.Config{Host: srv.URL})
		if err != nil {
			t.Fatal(err)
		}
		if got := apiServerReady(client)(context.Background()); got != tt.ready {
			t.Errorf("/readyz %d: ready %v, want %v", tt.code, got, tt.ready)
		}
		srv.Close()
	}
}

// TestPatientListWatchLongOutage: calls tried while waiting that fail again
// do not end the wait (the reflector would back off up to a minute); the
// wait ends with the server's return.
func TestPatientListWatchLongOutage(t *testing.T) {
	var calls, probes atomic.Int32
	inner := &cache.ListWatch{ListWithContextFunc: func(context.Context, metav1.ListOptions) (runtime.Object, error) {
		calls.Add(1)
		if probes.Load() <= 8 {
			return nil, errors.New("connection refused")
		}
		return &v1.ServiceList{}, nil
	}}
	p := newPatientListWatch(inner, newReadiness(func(context.Context) bool { return probes.Add(1) > 8 }), "test")
	p.probes.every, p.probes.cap = 50*time.Millisecond, 100*time.Millisecond
	p.maxWait = 4 * p.probes.every
	done := make(chan error, 1)
	go func() { _, err := p.ListWithContext(context.Background(), metav1.ListOptions{}); done <- err }()
	select {
	case err := <-done:
		if err != nil || calls.Load() < 3 {
			t.Fatalf("err %v after %d calls, want success after calls tried while waiting", err, calls.Load())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the wait did not end with the server's return")
	}
}

// TestPatientListWatchRetriesRefusals: a server that refuses (403, 401),
// as one that just restarted does until its RBAC is loaded, is asked again
// every refusedEvery until it allows the call, whatever its readiness says:
// handed to the reflector, the refusals started a backoff that kept the
// informer away up to a minute after they passed. Another error ends the
// retries, and so does the context.
func TestPatientListWatchRetriesRefusals(t *testing.T) {
	forbidden := apierrors.NewForbidden(schema.GroupResource{Group: "discovery.k8s.io", Resource: "endpointslices"}, "", errors.New("RBAC: not loaded"))
	unauthorized := apierrors.NewUnauthorized("token not yet known")
	for _, tt := range []struct {
		name      string
		errs      []error // the calls' errors before one succeeds
		wantErr   bool
		wantCalls int32
	}{
		{"refused, then allowed", []error{forbidden, unauthorized, forbidden}, false, 4},
		{"refused, then another error: the reflector's", []error{forbidden, errors.New("boom")}, true, 2},
		// A server back from a restart answers its readiness probe before
		// its RBAC cache is loaded: the retry after the outage was handed
		// to the reflector, whose backoff made changes 1-14 s late.
		{"outage, then refused once ready, then allowed", []error{errors.New("connection refused"), forbidden, forbidden}, false, 4},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var calls, probes atomic.Int32
			inner := &cache.ListWatch{ListWithContextFunc: func(context.Context, metav1.ListOptions) (runtime.Object, error) {
				if n := calls.Add(1); int(n) <= len(tt.errs) {
					return nil, tt.errs[n-1]
				}
				return &v1.ServiceList{}, nil
			}}
			// Not ready at the first probe: the connection-refused case
			// waits for readiness.
			p := newPatientListWatch(inner, newReadiness(func(context.Context) bool { return probes.Add(1) > 1 }), "test")
			p.refusedEvery = 5 * time.Millisecond
			_, err := p.ListWithContext(context.Background(), metav1.ListOptions{})
			if (err != nil) != tt.wantErr || calls.Load() != tt.wantCalls {
				t.Errorf("err %v after %d calls, want error %v after %d", err, calls.Load(), tt.wantErr, tt.wantCalls)
			}
		})
	}
	inner := &cache.ListWatch{ListWithContextFunc: func(context.Context, metav1.ListOptions) (runtime.Object, error) {
		return nil, forbidden
	}}
	p := newPatientListWatch(inner, newReadiness(func(context.Context) bool { return true }), "test")
	p.refusedEvery = 5 * time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := p.ListWithContext(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("a refusal to the end: err %v, want the refusal once the context ended", err)
	}
}

// A server certificate that does not verify is told apart from an outage.
func TestBadCertificate(t *testing.T) {
	if !badCertificate(&url.Error{Op: "Get", URL: "https://x", Err: &tls.CertificateVerificationError{Err: x509.HostnameError{Host: "localhost", Certificate: &x509.Certificate{}}}}) {
		t.Error("a hostname mismatch is not a bad certificate")
	}
	if !badCertificate(fmt.Errorf("get: %w", x509.UnknownAuthorityError{})) {
		t.Error("an unknown authority is not a bad certificate")
	}
	if badCertificate(errors.New("connection refused")) {
		t.Error("connection refused is a bad certificate")
	}
}

// TestPatientListWatchHungCall: a call that hangs (a connection into a path
// that drops packets waits out client-go's 30 s dial timeout) while the API
// server is away is made anew once the server is ready again, instead of
// holding the informer until it times out; the new watch's context lives
// until the watch stops. A slow call to a server that stays ready is left
// alone.
func TestPatientListWatchHungCall(t *testing.T) {
	for _, what := range []string{"list", "watch"} {
		t.Run(what, func(t *testing.T) {
			var calls, probes atomic.Int32
			ctxs := make(chan context.Context, 4)
			hangFirst := func(ctx context.Context) error {
				ctxs <- ctx
				if calls.Add(1) == 1 {
					<-ctx.Done() // an unanswered SYN
					return fmt.Errorf("dial tcp: %w", ctx.Err())
				}
				return nil
			}
			inner := &cache.ListWatch{
				ListWithContextFunc: func(ctx context.Context, _ metav1.ListOptions) (runtime.Object, error) {
					if err := hangFirst(ctx); err != nil {
						return nil, err
					}
					return &v1.ServiceList{}, nil
				},
				WatchFuncWithContext: func(ctx context.Context, _ metav1.ListOptions) (watch.Interface, error) {
					if err := hangFirst(ctx); err != nil {
						return nil, err
					}
					return watch.NewFake(), nil
				},
			}
			// Away for the first two probes, then back.
			p := newPatientListWatch(inner, newReadiness(func(context.Context) bool { return probes.Add(1) > 2 }), "test")
			p.hungAfter, p.probes.every = 20*time.Millisecond, 10*time.Millisecond
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			began := time.Now()
			var err error
			var w watch.Interface
			if what == "list" {
				_, err = p.ListWithContext(ctx, metav1.ListOptions{})
			} else {
				w, err = p.WatchWithContext(ctx, metav1.ListOptions{})
			}
			if err != nil || time.Since(began) > 2*time.Second {
				t.Fatalf("%s returned %v after %v, want the second call's success at the server's return", what, err, time.Since(began).Round(time.Millisecond))
			}
			first, second := <-ctxs, <-ctxs
			if first.Err() == nil {
				t.Error("the hung call's context was not cancelled")
			}
			if what == "watch" {
				if second.Err() != nil {
					t.Error("the watch's context ended before the watch")
				}
				w.Stop()
				if second.Err() == nil {
					t.Error("the watch's context outlived the watch")
				}
			} else if second.Err() == nil {
				t.Error("the list's context outlived the list")
			}
		})
	}

	var calls atomic.Int32
	slow := &cache.ListWatch{ListWithContextFunc: func(ctx context.Context, _ metav1.ListOptions) (runtime.Object, error) {
		calls.Add(1)
		time.Sleep(100 * time.Millisecond)
		return &v1.ServiceList{}, nil
	}}
	p := newPatientListWatch(slow, newReadiness(func(context.Context) bool { return true }), "test")
	p.hungAfter, p.probes.every = 10*time.Millisecond, 5*time.Millisecond
	if _, err := p.ListWithContext(context.Background(), metav1.ListOptions{}); err != nil || calls.Load() != 1 {
		t.Errorf("a slow list to a ready server: err %v after %d calls, want its success after 1", err, calls.Load())
	}
}

// TestPatientListSlowWhileReadinessFlaps: a list slower than hungAfter to
// a server whose /readyz fails one probe in two (an etcd health check
// timing out under load, when lists are slow too) completes: raced
// abandoned and made it anew at every failed-then-passed probe, so it never
// completed (31 lists in 5 s, each a full list on a loaded server).
func TestPatientListSlowWhileReadinessFlaps(t *testing.T) {
	var calls, probes atomic.Int32
	inner := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, _ metav1.ListOptions) (runtime.Object, error) {
			calls.Add(1)
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-time.After(300 * time.Millisecond):
			}
			return &v1.ServiceList{}, nil
		},
		WatchFuncWithContext: func(context.Context, metav1.ListOptions) (watch.Interface, error) { return watch.NewFake(), nil },
	}
	p := newPatientListWatch(inner, newReadiness(func(context.Context) bool { return probes.Add(1)%2 == 0 }), "test")
	p.hungAfter, p.probes.every = 100*time.Millisecond, 50*time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := p.ListWithContext(ctx, metav1.ListOptions{}); err != nil {
		t.Fatalf("list: %v after %d calls", err, calls.Load())
	}
	if n := calls.Load(); n > 4 {
		t.Errorf("%d lists, want the slow list let finish after a few abandons", n)
	}
}

// TestPatientListWatchProbesBackOff: while the API server is away a waiting
// list probes its /readyz at growing, jittered intervals, counted here at an
// API server that answers 503 to everything. At a fixed 250 ms each informer
// probed 4 times a second for the whole outage (three informers: held only
// by the client's QPS limit, 5/s, on every node at once).
func TestPatientListWatchProbesBackOff(t *testing.T) {
	var readyz atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/readyz" {
			readyz.Add(1)
		}
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	defer srv.Close()
	client, err := kubernetes.NewForConfig(&rest.Config{Host: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	inner := &cache.ListWatch{ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
		return client.CoreV1().Services(metav1.NamespaceAll).List(ctx, o)
	}}
	p := newPatientListWatch(inner, newReadiness(apiServerReady(client)), "test")
	const outage = 4 * time.Second
	ctx, cancel := context.WithTimeout(context.Background(), outage)
	defer cancel()
	if _, err := p.ListWithContext(ctx, metav1.ListOptions{}); err == nil {
		t.Fatal("list succeeded against a server that answers 503")
	}
	// 250 ms, 500 ms, 1 s, 2 s, each stretched by up to half: 4 or 5 waits
	// end within 4 s, each followed by a probe, after the first probe.
	if n := readyz.Load(); n > 6 {
		t.Errorf("%d /readyz requests in %v of outage, want at most 6 (backing off from 250 ms to 2 s)", n, outage)
	}
}

// TestProbeDelays: the waits between probes start at pollEvery, double to
// pollCap and are stretched by up to half, so that a long outage is seen to
// end within 1.5 × pollCap of the server's return.
func TestProbeDelays(t *testing.T) {
	p := newPatientListWatch(&cache.ListWatch{}, newReadiness(func(context.Context) bool { return false }), "test")
	for range 20 { // the jitter is random: its bounds hold for every draw
		delays := p.probes.delays()
		for i, base := range []time.Duration{250 * time.Millisecond, 500 * time.Millisecond, time.Second, 2 * time.Second, 2 * time.Second, 2 * time.Second} {
			if d := delays(); d < base || d > base*3/2 {
				t.Fatalf("wait %d: %v, want within [%v, %v]", i+1, d, base, base*3/2)
			}
		}
	}
}

// TestRacedProbesBackOff: while a call hangs and /readyz answers "not ready"
// at once (kube-apiserver up, etcd away: lists hang, every probe is served),
// the probes back off as patiently's waits do. At a fixed pollEvery each
// informer probed such a server 4 times a second for as long as it hung.
func TestRacedProbesBackOff(t *testing.T) {
	var probes atomic.Int32
	inner := &cache.ListWatch{ListWithContextFunc: func(ctx context.Context, _ metav1.ListOptions) (runtime.Object, error) {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(2 * time.Second):
		}
		return &v1.ServiceList{}, nil
	}}
	p := newPatientListWatch(inner, newReadiness(func(context.Context) bool { probes.Add(1); return false }), "test")
	p.hungAfter, p.probes.every, p.probes.cap = 10*time.Millisecond, 10*time.Millisecond, 80*time.Millisecond
	if _, err := p.ListWithContext(context.Background(), metav1.ListOptions{}); err != nil {
		t.Fatalf("list: %v", err)
	}
	// 10, 20, 40 ms, then 80-120 ms apart: about 20 probes in 2 s (200 at a fixed 10 ms).
	if n := probes.Load(); n > 40 {
		t.Errorf("%d probes while a list hung 2 s, want at most 40 (backing off from 10 ms to 80 ms)", n)
	}
}

// TestInformerSourceSharesReadinessProbes: while the API server is away, the
// source's three informers (Services, EndpointSlices, the Node) wait on one
// stream of /readyz probes, not one each: three streams tripled what each
// node sent a server that was struggling to come back.
func TestInformerSourceSharesReadinessProbes(t *testing.T) {
	var readyz atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/readyz" {
			readyz.Add(1)
		}
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	defer srv.Close()
	client, err := kubernetes.NewForConfig(&rest.Config{Host: srv.URL, QPS: -1})
	if err != nil {
		t.Fatal(err)
	}
	r := newInformerRecorder()
	const outage = 4 * time.Second
	ctx, cancel := context.WithTimeout(context.Background(), outage)
	defer cancel()
	if err := NewInformerSource(client, r, InformerOptions{NodeName: "n1", NodeHandler: r}).Run(ctx); err == nil {
		t.Fatal("Run synced against a server that answers 503")
	}
	// One stream: the informers' first probes, made together, and 4 or 5
	// waits of 250 ms doubling to 2 s (each stretched by up to half), each
	// followed by a probe. Three streams made 15 or more.
	n := readyz.Load()
	if n > 8 {
		t.Errorf("%d /readyz requests in %v of outage from one source's three informers, want at most 8 (one stream of probes)", n, outage)
	}
}
