// Command etcd is the etcd v3.6 server, built from go.etcd.io/etcd/server/v3 so that the
// control-plane tests need nothing beyond the Go module proxy.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
