package proxier

import (
	"errors"
	"net"
	"net/netip"
	"os"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"
)

// "No endpoint" is said at -v=0 once per period per service port; the
// rest are counted into the next line.
func TestNoBackendLogRateLimited(t *testing.T) {
	buf := captureKlog(t)

	var l noBackendLog
	client := netip.MustParseAddrPort("10.0.0.1:1234")
	for range 5 {
		l.report("default/web:http", client, errors.New("no endpoints"))
	}
	klog.Flush()
	if n := strings.Count(buf.String(), "No endpoint could be reached"); n != 1 {
		t.Fatalf("%d lines at -v=0 for 5 failures in a row, want 1:\n%s", n, buf.String())
	}
	if got := l.suppressed.Load(); got != 4 {
		t.Fatalf("%d suppressed, want 4", got)
	}
}

// connect's EADDRNOTAVAIL is also a node without a usable source address
// of the endpoint's family (IPv6 disabled, an address still tentative):
// the line said only "out of descriptors or ports", and sent the operator
// after a leak that was not there.
func TestNoBackendLogNamesAMissingSourceAddress(t *testing.T) {
	buf := captureKlog(t)

	var l noBackendLog
	l.report("t/mis4:http", netip.MustParseAddrPort("10.61.1.2:42662"), &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", unix.EADDRNOTAVAIL)})
	klog.Flush()
	if want := "or no source address of the endpoint's IP family"; !strings.Contains(buf.String(), want) {
		t.Fatalf("line lacks %q:\n%s", want, buf.String())
	}
}
