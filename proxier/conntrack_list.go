package proxier

import (
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// ConntrackEntries lists the IPv4 conntrack table of the calling thread's
// network namespace over netlink, one line per flow in netlink's
// "proto src= dst= sport= dport= ... src= dst= ..." form (the original
// direction first, then the reply). The demo shows it when neither
// /proc/net/nf_conntrack nor the conntrack tool is there.
func ConntrackEntries() ([]string, error) {
	flows, err := netlink.ConntrackTableList(netlink.ConntrackTable, unix.AF_INET)
	if err != nil {
		return nil, err
	}
	out := make([]string, 0, len(flows))
	for _, f := range flows {
		out = append(out, f.String())
	}
	return out, nil
}
