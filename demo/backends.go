package demo

import (
	"github.com/kube-userspace-proxy/kube-userspace-proxy/test/harness/backend"
)

// startBackends starts one "pod" per name: a backend that names itself
// (backend.Demo: HTTP/1.1 whose body is the name, so curl works; a UDP echo
// that puts the name before each datagram it sends back), on 127.0.0.1 with
// kernel-chosen TCP and UDP ports. On error nothing stays open.
func startBackends(names ...string) ([]*backend.Server, error) {
	return startBackendsAt(func(int) string { return "127.0.0.1" }, func(f func() error) error { return f() }, names...)
}

// startBackendsAt starts backend i on host(i), opening its sockets inside
// in (a network namespace, for demo --netns).
func startBackendsAt(host func(i int) string, in func(func() error) error, names ...string) ([]*backend.Server, error) {
	var out []*backend.Server
	for i, name := range names {
		var b *backend.Server
		err := in(func() error {
			var err error
			b, err = backend.Listen(name, backend.Demo, host(i)+":0", false, nil)
			return err
		})
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
