package main

// Checks of flag values that a parse alone does not make: what would
// otherwise fail only once the proxy runs, and exit 1 like a runtime
// failure instead of 2 like the usage error it is.

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/netip"
	"net/url"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/rest"
)

// checkHostPort checks a HOST:PORT flag as kube-proxy does its bind
// addresses: the port a number 0-65535 (0: any free port), the host empty
// (every address), an IP or a host name. A bad one was only found by the
// listen, after the proxy had started, and exited 1 like a runtime failure.
func checkHostPort(value string) error {
	host, port, err := net.SplitHostPort(value)
	if err != nil {
		return errors.New("want HOST:PORT")
	}
	if _, err := strconv.ParseUint(port, 10, 16); err != nil {
		return fmt.Errorf("port %q is not a number 0-65535", port)
	}
	if host == "" {
		return nil
	}
	if _, err := netip.ParseAddr(host); err == nil {
		return nil
	}
	if msgs := validation.IsDNS1123Subdomain(strings.ToLower(host)); len(msgs) > 0 {
		return fmt.Errorf("host %q is neither an IP address nor a host name", host)
	}
	return nil
}

// The servers' default ports, kube-proxy's.
const (
	defaultHealthzPort = "10256"
	defaultMetricsPort = "10249"

	defaultHealthzPortNumber = 10256
	defaultMetricsPortNumber = 10249
)

// withDefaultPort returns value with port appended when it is an IP address
// alone ("0.0.0.0", "::"), as kube-proxy's AppendPortIfNeeded; anything else
// is returned as it is, for checkHostPort to judge.
func withDefaultPort(value, port string) string {
	if a, err := netip.ParseAddr(value); err == nil && a.Zone() == "" {
		return net.JoinHostPort(a.String(), port)
	}
	return value
}

// statReason is why a path cannot be read, without the path os.Stat
// repeats ("no such file or directory", "permission denied").
func statReason(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// checkMasterURL checks --master as client-go will read it (a URL, or a
// host[:port] taken as http://host[:port]) so that a value it cannot use
// is a flag error (exit 2) and not, after --init-only said all was well,
// an exit 1 at the client's start or a scheme or port retried forever.
// client-go's own parse decides what is a URL: a copy of it had re-read
// 'http://[::1' as http://http://[::1 and let it through.
func checkMasterURL(master string) error {
	u, _, err := rest.DefaultServerURL(master, "", schema.GroupVersion{}, false)
	if err != nil {
		// A value that has a scheme but does not parse is re-read there as
		// http://VALUE, and the error quotes that ("http://http://%zz"):
		// the parse of the value itself names what the user typed.
		if _, perr := url.Parse(master); perr != nil && strings.Contains(master, "://") {
			return perr
		}
		return err // "host must be a URL or a host:port pair", the start's own words
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return fmt.Errorf("the scheme must be http or https, not %q", u.Scheme)
	}
	if u.Host == "" {
		return fmt.Errorf("names no host")
	}
	if port := u.Port(); port != "" {
		// url.Parse takes any digits; no dial can reach port 0 or 99999.
		if n, err := strconv.ParseUint(port, 10, 16); err != nil || n == 0 {
			return fmt.Errorf("port %s is not a number 1-65535", port)
		}
	}
	return nil
}
