package soak

import (
	"testing"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/test/harness"
)

func TestMain(m *testing.M) { harness.Main(m) } // removes the binaries it built
