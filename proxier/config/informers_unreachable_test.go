package config

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/internal/lockedbuf"
)

// An API server that never answers: Run gives up when its context does,
// with an error that says why the context ended and what the last list
// failed with, and logs no "Unable to sync caches" error (a stop before
// the sync is no error; Ctrl-C printed it as logger="UnhandledError").
func TestInformerSourceUnreachableSaysWhy(t *testing.T) {
	logs := &lockedbuf.Buffer{}
	captureKlog(t)
	klog.SetOutput(logs)
	client, err := kubernetes.NewForConfig(&rest.Config{Host: "http://127.0.0.1:1"})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		ctx   func() (context.Context, context.CancelFunc)
		cause error
	}{
		{"deadline", func() (context.Context, context.CancelFunc) {
			return context.WithTimeout(context.Background(), time.Second)
		}, context.DeadlineExceeded},
		{"stop", func() (context.Context, context.CancelFunc) {
			ctx, cancel := context.WithCancel(context.Background())
			time.AfterFunc(time.Second, cancel)
			return ctx, cancel
		}, context.Canceled},
	} {
		ctx, cancel := tc.ctx()
		err := NewInformerSource(client, newInformerRecorder(), InformerOptions{}).Run(ctx)
		cancel()
		if !errors.Is(err, tc.cause) || !errors.Is(err, errNotSynced) {
			t.Errorf("%s: Run = %v, want %v and %v", tc.name, err, errNotSynced, tc.cause)
		}
		if err == nil || !strings.Contains(err.Error(), "connection refused") {
			t.Errorf("%s: Run = %v, want the last error, the refused dial", tc.name, err)
		}
	}
	time.Sleep(100 * time.Millisecond) // the informers' goroutines log after Run returned
	if strings.Contains(logs.String(), "Unable to sync caches") {
		t.Errorf("a stop before the sync was logged as an error:\n%s", logs.String())
	}
}
