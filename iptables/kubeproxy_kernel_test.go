package iptables

import (
	"strings"
	"testing"

	"github.com/google/nftables"
)

// On the real kernel, in a namespace of the test's own: the table of
// kube-proxy's nftables mode is found through netlink in the runner's
// namespace, said with the command that removes it, and said gone once
// it is (the listing is the product's; the table is made with the same
// library, as kube-proxy's knftables would, so no nft binary is needed).
func TestKernelKubeProxyNftTableIsSaid(t *testing.T) {
	requireRealIptables(t)
	ns := newNetns(t)
	th := startNSThread(t, ns)
	kubeProxy := &nftables.Table{Family: nftables.TableFamilyIPv4, Name: kubeProxyNftTable}
	// nft edits the kube-proxy table in the namespace: add or delete it.
	nft := func(edit func(*nftables.Conn)) {
		t.Helper()
		var err error
		th.do(func() {
			var conn *nftables.Conn
			if conn, err = nftables.New(); err == nil {
				edit(conn)
				err = conn.Flush()
			}
		})
		if err != nil {
			t.Fatalf("nftables: %v", err)
		}
	}
	nft(func(c *nftables.Conn) { c.AddTable(kubeProxy) })

	logs := captureKlog(t)
	rules := New(newNSRunner(t, ns, IPv4), Config{Family: IPv4})
	syncOK(t, rules, webPortals())
	if want := "nft delete table ip kube-proxy"; !strings.Contains(logs.String(), want) {
		t.Fatalf("kube-proxy's nftables table was not said, with %s:\n%s", want, logs)
	}
	nft(func(c *nftables.Conn) { c.DelTable(kubeProxy) })
	syncOK(t, rules, webPortals())
	if !strings.Contains(logs.String(), "kube-proxy's nftables table is gone") {
		t.Errorf("the table's removal was not said:\n%s", logs)
	}
}
