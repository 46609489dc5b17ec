package rawio

import (
	"encoding/binary"
	"net/netip"
	"strconv"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Socket addresses are kept in a RawSockaddrInet6, which holds either
// family's: the event loops and the UDP batches keep arrays of them, and
// one encoder and one decoder serve accept, connect, recvmmsg and sendmmsg.

// PutSockaddr writes ep into sa as an address for a socket of family and
// returns its length, or false when ep cannot be one: an AF_INET socket
// takes only IPv4; an AF_INET6 socket takes IPv6 (a numeric zone as the
// scope id, the interface index) and IPv4 as ::ffff:a.b.c.d.
func PutSockaddr(sa *unix.RawSockaddrInet6, ep netip.AddrPort, family int) (uint32, bool) {
	addr := ep.Addr()
	switch {
	case family == unix.AF_INET && addr.Is4():
		in := (*unix.RawSockaddrInet4)(unsafe.Pointer(sa))
		*in = unix.RawSockaddrInet4{Family: unix.AF_INET, Addr: addr.As4()}
		putPort(&in.Port, ep.Port())
		return unix.SizeofSockaddrInet4, true
	case family == unix.AF_INET6 && addr.IsValid():
		*sa = unix.RawSockaddrInet6{Family: unix.AF_INET6, Addr: addr.As16()}
		if zone := addr.Zone(); zone != "" {
			id, err := strconv.ParseUint(zone, 10, 32)
			if err != nil {
				return 0, false
			}
			sa.Scope_id = uint32(id)
		}
		putPort(&sa.Port, ep.Port())
		return unix.SizeofSockaddrInet6, true
	}
	return 0, false
}

// AddrPortOf decodes a socket address the kernel wrote into sa: IPv4-mapped
// addresses unmapped, an IPv6 scope id as the zone (the net package
// resolves a numeric zone when sending, and small numbers format without
// allocating); the zero AddrPort for another family.
func AddrPortOf(sa *unix.RawSockaddrInet6) netip.AddrPort {
	p := binary.BigEndian.Uint16((*[2]byte)(unsafe.Pointer(&sa.Port))[:])
	switch sa.Family {
	case unix.AF_INET:
		in := (*unix.RawSockaddrInet4)(unsafe.Pointer(sa))
		return netip.AddrPortFrom(netip.AddrFrom4(in.Addr), p)
	case unix.AF_INET6:
		addr := netip.AddrFrom16(sa.Addr).Unmap()
		if sa.Scope_id != 0 && addr.Is6() {
			addr = addr.WithZone(strconv.FormatUint(uint64(sa.Scope_id), 10))
		}
		return netip.AddrPortFrom(addr, p)
	}
	return netip.AddrPort{}
}

// putPort stores a port in network byte order.
func putPort(dst *uint16, port uint16) {
	binary.BigEndian.PutUint16((*[2]byte)(unsafe.Pointer(dst))[:], port)
}
