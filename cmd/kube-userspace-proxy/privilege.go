package main

import (
	"errors"

	"golang.org/x/sys/unix"
)

// errNoNetAdmin is what a user without the privilege iptables needs sees
// at start, instead of a sync failing twice a second forever while
// /healthz still says 200.
var errNoNetAdmin = errors.New("needs root or CAP_NET_ADMIN for iptables; run with --iptables=false for sockets only")

// errNoNetAdminCleanup is --cleanup's: said once, instead of a permission
// error from iptables for each chain and family.
var errNoNetAdminCleanup = errors.New("needs root or CAP_NET_ADMIN to remove iptables rules")

// canProgramIptables reports whether this process may change netfilter
// rules: CAP_NET_ADMIN in its effective set. Root is not enough: root in a
// container without NET_ADMIN passed, and iptables then failed with
// "Permission denied (you must be root)" for each chain.
var canProgramIptables = func() bool {
	caps, err := effectiveCaps()
	return err == nil && caps&(1<<unix.CAP_NET_ADMIN) != 0
}

// effectiveCaps is this process's effective capability set, bit n for
// capability n; a variable so that tests can give any set.
var effectiveCaps = func() (uint64, error) {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return 0, err
	}
	return uint64(data[1].Effective)<<32 | uint64(data[0].Effective), nil
}
