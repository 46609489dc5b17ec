package harness_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/test/harness"
)

func TestRulesFor(t *testing.T) {
	dump := `*nat
:KUBE-PORTALS-CONTAINER - [0:0]
-A KUBE-PORTALS-CONTAINER -d 10.96.0.10/32 -p tcp -m comment --comment "e2e/rr:http" -m tcp --dport 80 -j REDIRECT --to-ports 40000
-A KUBE-PORTALS-CONTAINER -d 10.96.0.11/32 -p tcp -m comment --comment "e2e/rr:http2" -m tcp --dport 80 -j REDIRECT --to-ports 40001
-A KUBE-PORTALS-HOST -d 10.96.0.10/32 -p tcp -m comment --comment e2e/rr:http -m tcp --dport 80 -j DNAT --to-destination 10.77.1.1:40000
COMMIT
`
	lines := strings.Split(dump, "\n")
	want := []string{lines[2], lines[4]} // quoted and bare; not e2e/rr:http2
	if got := harness.RulesFor(dump, "e2e/rr:http"); !slices.Equal(got, want) {
		t.Errorf("RulesFor = %q, want %q", got, want)
	}
}
