package proxier

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// The kernel's ephemeral port range and reserved ports are per network
// namespace. /proc/sys/net is resolved against the namespace of the thread
// that opens the file, so the proxier reads them in New, on the thread (and
// so in the namespace) that later opens its sockets: the whole process
// under `ip netns exec`, or a test's locked thread.
const (
	ephemeralRangePath = "/proc/sys/net/ipv4/ip_local_port_range"
	reservedPortsPath  = "/proc/sys/net/ipv4/ip_local_reserved_ports"
)

// kernelPorts is what the kernel says about local ports in one namespace.
type kernelPorts struct {
	// Ephemeral is where bind(0) and connect() pick source ports.
	Ephemeral PortRange
	// Reserved are ports the administrator kept for services
	// (ip_local_reserved_ports); we keep off them too.
	Reserved []PortRange
}

// readKernelPorts reads this thread's namespace's port sysctls. A missing
// reserved list is no reservation; a missing range is an error (the caller
// then lets the kernel choose every port, as before).
func readKernelPorts(read func(string) ([]byte, error)) (kernelPorts, error) {
	var kp kernelPorts
	b, err := read(ephemeralRangePath)
	if err != nil {
		return kp, err
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return kp, fmt.Errorf("%s: want two numbers, got %q", ephemeralRangePath, b)
	}
	lo, err1 := strconv.Atoi(f[0])
	hi, err2 := strconv.Atoi(f[1])
	if err1 != nil || err2 != nil || lo < 1 || hi > 65535 || lo > hi {
		return kp, fmt.Errorf("%s: bad range %q", ephemeralRangePath, b)
	}
	kp.Ephemeral = PortRange{Base: lo, Size: hi - lo + 1}
	if b, err := read(reservedPortsPath); err == nil {
		kp.Reserved = parseReservedPorts(string(b))
	}
	return kp, nil
}

// reserved tells whether port is one of the reserved ports.
func (kp kernelPorts) reserved(port int) bool {
	for _, r := range kp.Reserved {
		if port >= r.Base && port < r.Base+r.Size {
			return true
		}
	}
	return false
}

// parseReservedPorts reads the kernel's "1,3-5,8080" list; bad items are
// skipped (the kernel never writes them).
func parseReservedPorts(s string) []PortRange {
	var out []PortRange
	for _, item := range strings.Split(strings.TrimSpace(s), ",") {
		if item == "" {
			continue
		}
		a, b, isRange := strings.Cut(item, "-")
		lo, err := strconv.Atoi(a)
		if err != nil {
			continue
		}
		hi := lo
		if isRange {
			if hi, err = strconv.Atoi(b); err != nil {
				continue
			}
		}
		if lo >= 1 && hi <= 65535 && lo <= hi {
			out = append(out, PortRange{Base: lo, Size: hi - lo + 1})
		}
	}
	return out
}

func readKernelPortsFromProc() (kernelPorts, error) { return readKernelPorts(os.ReadFile) }
