package demo

import (
	"github.com/kube-userspace-proxy/kube-userspace-proxy/test/harness/backend"
)

// startBackends starts one "pod" per name: a backend that names itself
// (backend.Demo: HTTP/1.1 whose body is the name, so curl works; a UDP echo
// that puts the name before each datagram it sends back), on 127.0.0.1 with
// kernel-chosen TCP and UDP ports. On error nothing stays open.
func startBackends(names ...string) ([]*backend.Server, error) {
	var out []*backend.Server
	for _, name := range names {
		b, err := backend.Listen(name, backend.Demo, "127.0.0.1:0", false, nil)
		if err != nil {
			stopBackends(out)
			return nil, err
		}
		out = append(out, b)
	}
	return out, nil
}

func stopBackends(bs []*backend.Server) {
	for _, b := range bs {
		b.Close()
	}
}

// backendByTCPAddr maps a TCP endpoint ("127.0.0.1:PORT") back to its name, so
// that tables speak of backend-a rather than of port numbers.
func backendByTCPAddr(bs []*backend.Server, addr string) string {
	for _, b := range bs {
		if b.TCPAddr().String() == addr {
			return b.Name
		}
	}
	return addr
}
