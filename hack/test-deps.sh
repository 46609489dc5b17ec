#!/usr/bin/env bash
# Installs what `make test` needs on a fresh machine: Go modules always;
# as root, the Debian packages the race detector and the namespace suites use
# (gcc, iproute2, iptables)
# and the test control plane (kube-apiserver + etcd built from the Go module
# proxy into a cache outside the repo, reused once built). Not root: the
# suites that need these skip with a message, so nothing is installed.
# GO names the go command (the Makefile's $(GO)); the control plane is
# built with it too.
set -euo pipefail
cd "$(dirname "$0")/.."
export GO=${GO:-go}

"$GO" mod download

if [ "$(id -u)" != 0 ]; then
	# Nothing is installed without root, and go test -race cannot build
	# without a C compiler: say what to install, not Go's "-race requires
	# cgo; enable cgo by setting CGO_ENABLED=1".
	if ! hack/race-cc.sh; then
		echo "test-deps: not root, so nothing is installed" >&2
		exit 1
	fi
	echo "test-deps: not root; namespace and control-plane suites will skip" >&2
	exit 0
fi

missing=()
# go test -race builds with cgo: a C compiler and the C library's headers.
command -v "$("$GO" env CC)" >/dev/null || missing+=(gcc libc6-dev)
command -v ip >/dev/null || missing+=(iproute2)
command -v iptables-restore >/dev/null || missing+=(iptables)
command -v ip6tables-restore >/dev/null || missing+=(iptables)
if [ ${#missing[@]} -gt 0 ]; then
	echo "test-deps: installing ${missing[*]}" >&2
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq
	apt-get install -y -qq "${missing[@]}" >/dev/null
fi

if [ -z "${KUP_SKIP_CONTROLPLANE:-}" ] && [ -x test/controlplane/build.sh ]; then
	test/controlplane/build.sh >/dev/null
fi
