package main

import (
	"errors"
	"os"

	"golang.org/x/sys/unix"
)

// errNoNetAdmin is what a user without the privilege iptables needs sees
// at start, instead of a sync failing twice a second forever while
// /healthz still says 200.
var errNoNetAdmin = errors.New("needs root or CAP_NET_ADMIN for iptables; run with --iptables=false for sockets only")

// errNoNetAdminCleanup is --cleanup's: said once, instead of a permission
// error from iptables for each chain and family.
var errNoNetAdminCleanup = errors.New("needs root or CAP_NET_ADMIN to remove iptables rules")

// capNetAdmin is CAP_NET_ADMIN's bit in the effective set.
const capNetAdmin = 12

// canProgramIptables reports whether this process may change netfilter
// rules: root, or CAP_NET_ADMIN in its effective set.
var canProgramIptables = func() bool {
	if os.Geteuid() == 0 {
		return true
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return false
	}
	return data[0].Effective&(1<<capNetAdmin) != 0
}
