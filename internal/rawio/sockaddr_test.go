package rawio

import (
	"net/netip"
	"testing"

	"golang.org/x/sys/unix"
)

func TestSockaddrRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		in     string
		family int
		ok     bool
		length uint32
		out    string // what AddrPortOf reads back
	}{
		{"192.0.2.1:53", unix.AF_INET, true, unix.SizeofSockaddrInet4, "192.0.2.1:53"},
		{"192.0.2.1:53", unix.AF_INET6, true, unix.SizeofSockaddrInet6, "192.0.2.1:53"}, // as ::ffff:192.0.2.1, unmapped again
		{"[2001:db8::1]:8080", unix.AF_INET6, true, unix.SizeofSockaddrInet6, "[2001:db8::1]:8080"},
		{"[fe80::1%3]:546", unix.AF_INET6, true, unix.SizeofSockaddrInet6, "[fe80::1%3]:546"},
		{"[2001:db8::1]:8080", unix.AF_INET, false, 0, ""},
		{"[fe80::1%eth0]:546", unix.AF_INET6, false, 0, ""}, // only an interface index is a scope id
	} {
		t.Run(tc.in, func(t *testing.T) {
			var sa unix.RawSockaddrInet6
			n, ok := PutSockaddr(&sa, netip.MustParseAddrPort(tc.in), tc.family)
			if ok != tc.ok || n != tc.length {
				t.Fatalf("PutSockaddr = %d, %v; want %d, %v", n, ok, tc.length, tc.ok)
			}
			if !ok {
				return
			}
			if int(sa.Family) != tc.family {
				t.Errorf("family %d, want %d", sa.Family, tc.family)
			}
			if got := AddrPortOf(&sa); got.String() != tc.out {
				t.Errorf("AddrPortOf = %v, want %v", got, tc.out)
			}
		})
	}
	if got := AddrPortOf(&unix.RawSockaddrInet6{Family: unix.AF_UNIX}); got.IsValid() {
		t.Errorf("AddrPortOf(AF_UNIX) = %v, want the zero AddrPort", got)
	}
	var zero unix.RawSockaddrInet6
	if _, ok := PutSockaddr(&zero, netip.AddrPort{}, unix.AF_INET6); ok {
		t.Error("PutSockaddr took the zero AddrPort")
	}
}

// Connect refuses an address it cannot write (the zero AddrPort) instead
// of connecting somewhere.
func TestConnectInvalidAddress(t *testing.T) {
	fd, err := Socket(unix.AF_INET6)
	if err != nil {
		t.Skip(err)
	}
	defer Close(fd)
	if err := Connect(fd, netip.AddrPort{}); err != unix.EINVAL {
		t.Fatalf("Connect(zero AddrPort) = %v, want EINVAL", err)
	}
}
