package proxier

import (
	"bytes"
	"flag"
	"fmt"
	"strings"
	"testing"

	"k8s.io/klog/v2"
)

// captureKlog sends klog at -v=0 to a buffer until the test ends.
func captureKlog(t *testing.T) *bytes.Buffer {
	t.Helper()
	var buf bytes.Buffer
	fs := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(fs)
	_ = fs.Set("logtostderr", "false")
	_ = fs.Set("v", "0")
	klog.SetOutput(&buf)
	t.Cleanup(func() {
		klog.SetOutput(nil)
		klog.LogToStderr(true)
	})
	return &buf
}

// Each port a sync opens gets its "Serving service port" line at -v=0 (its
// proxy address), up to servingLinesUpTo of them; a sync that opens more
// (a first start on a big cluster) says it in one line.
func TestServingLinesPerSync(t *testing.T) {
	for _, tc := range []struct {
		ports     int
		wantLines int
		summary   bool
	}{
		{1, 1, false},
		{servingLinesUpTo, servingLinesUpTo, false},
		{servingLinesUpTo + 1, 0, true},
	} {
		t.Run(fmt.Sprint(tc.ports), func(t *testing.T) {
			buf := captureKlog(t)
			p := newTestProxier(t, Options{})
			for i := range tc.ports {
				p.OnServiceAdd(makeService(fmt.Sprintf("svc-%d", i), withClusterIP(fmt.Sprintf("10.96.%d.%d", i/250, i%250+1))))
			}
			p.Sync()
			klog.Flush()
			out := buf.String()
			if n := strings.Count(out, `"Serving service port"`); n != tc.wantLines {
				t.Errorf("%d per-port lines, want %d", n, tc.wantLines)
			}
			if tc.wantLines > 0 && !strings.Contains(out, `servicePort="default/svc-0:p" protocol="TCP" proxyAddress="127.0.0.1:`) {
				t.Errorf("no line for default/svc-0:p with its proxy address:\n%s", out)
			}
			summary := fmt.Sprintf(`"Serving service ports" opened=%d servicePorts=%d`, tc.ports, tc.ports)
			if got := strings.Contains(out, summary); got != tc.summary {
				t.Errorf("summary line %q present: %v, want %v", summary, got, tc.summary)
			}
			// The next sync opens one more: its own line again.
			p.OnServiceAdd(makeService("late", withClusterIP("10.99.0.1")))
			p.Sync()
			klog.Flush()
			if !strings.Contains(buf.String(), `servicePort="default/late:p"`) {
				t.Errorf("no line for a port opened by a later sync")
			}
		})
	}
}
