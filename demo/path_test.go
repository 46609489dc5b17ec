package demo

import (
	"bytes"
	"net/netip"
	"strings"
	"testing"
	"unicode/utf8"
)

// TestPacketPathPicture draws the path with and without a portal rule and
// checks that each station appears in a packet's order with its address,
// and that the picture fits the width.
func TestPacketPathPicture(t *testing.T) {
	base := packetPath{
		ClientName:  "client 1",
		Client:      netip.MustParseAddrPort("127.0.0.11:41307"),
		Dialed:      netip.MustParseAddrPort("127.0.0.1:35132"),
		ClusterIP:   netip.MustParseAddrPort("10.96.0.10:80"),
		Socket:      netip.MustParseAddrPort("127.0.0.1:35132"),
		ServicePort: "default/web:http",
		Affinity:    "none",
		Endpoints:   []string{"backend-a", "backend-b", "backend-c"},
		Backend:     "backend-b",
		BackendAddr: netip.MustParseAddrPort("127.0.0.1:40108"),
		Answer:      "backend-b",
	}
	portal := base
	portal.Client = netip.MustParseAddrPort("10.77.0.11:50000")
	portal.Where = "namespace kup-demo-client"
	portal.Dialed = portal.ClusterIP
	portal.Socket = netip.MustParseAddrPort("10.77.0.1:35132")
	portal.Rule = "-A KUBE-PORTALS-CONTAINER -d 10.96.0.10/32 -p tcp -m comment --comment default/web:http -m tcp --dport 80 -j DNAT --to-destination 10.77.0.1:35132"

	for _, tc := range []struct {
		name  string
		p     packetPath
		order []string
	}{
		{"loopback, no rule", base, []string{
			"client 1", "127.0.0.11:41307", "connects to 127.0.0.1:35132, the proxy socket itself",
			"portal rule", "none here", "10.96.0.10:80",
			"proxy socket", "127.0.0.1:35132", "default/web:http",
			"balancer", "backend-a, backend-b, backend-c", "picks backend-b",
			"backend ", "backend-b at 127.0.0.1:40108", `"backend-b"`,
		}},
		{"through a portal", portal, []string{
			"client 1", "10.77.0.11:50000 (namespace kup-demo-client)", "connects to 10.96.0.10:80, the Service's ClusterIP",
			"portal rule", "-d 10.96.0.10/32", "--to-destination", "10.77.0.1:35132",
			"proxy socket", "10.77.0.1:35132",
			"balancer", "picks backend-b",
			"backend ", "backend-b at 127.0.0.1:40108",
		}},
	} {
		for _, width := range []int{60, 100} {
			var out bytes.Buffer
			tc.p.render(&out, width)
			pic := out.String()
			// Wrapped text may split an address from its words; read the
			// picture's text column as one stream.
			var stream strings.Builder
			for _, line := range strings.Split(pic, "\n") {
				if n := utf8.RuneCountInString(line); n > width {
					t.Errorf("%s, width %d: line of %d runes: %q", tc.name, width, n, line)
				}
				stream.WriteString(strings.TrimLeft(strings.TrimPrefix(strings.TrimSpace(line), "│"), " "))
				stream.WriteString(" ")
			}
			flat := strings.Join(strings.Fields(stream.String()), " ")
			at := 0
			for _, want := range tc.order {
				j := strings.Index(flat[at:], strings.Join(strings.Fields(want), " "))
				if j < 0 {
					t.Errorf("%s, width %d: %q missing or out of order in\n%s", tc.name, width, want, pic)
					break
				}
				at += j + len(want)
			}
			if got := strings.Count(pic, "▼"); got != 4 {
				t.Errorf("%s: %d arrows, want 4 (five stations)\n%s", tc.name, got, pic)
			}
		}
	}
}
