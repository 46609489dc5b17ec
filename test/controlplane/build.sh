#!/usr/bin/env bash
# build.sh builds (or reuses) the test control plane: kube-apiserver v1.37.2 and etcd v3.6,
# each from its wrapper module next to this script, using only the Go module proxy.
#
# Binaries go to a cache directory outside the repository, keyed by a hash of the wrappers'
# go.mod/go.sum/sources and `go version`, so a cold build (15-20 min on 2 cores) happens once:
#   ${KUP_CACHE:-/var/cache/kube-userspace-proxy}/controlplane/<hash>/{kube-apiserver,etcd}
#
# Usage: build.sh            build when missing, print the binary directory on the last line
#        build.sh --print-dir print the directory the binaries belong in, build nothing
#        build.sh --check     exit 0 when both binaries are present, 1 otherwise
# GO names the go command (the Makefile's $(GO)); default: go on PATH.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
export GOWORK=off GOTOOLCHAIN=local GOFLAGS="-mod=readonly -buildvcs=false"
cache_root="${KUP_CACHE:-/var/cache/kube-userspace-proxy}/controlplane"
go=${GO:-go}

key="$( {
	"$go" version
	for f in apiserver/go.mod apiserver/go.sum apiserver/tools.go etcd/go.mod etcd/go.sum etcd/main.go; do
		echo "== $f"
		cat "$here/$f"
	done
} | sha256sum | cut -c1-16)"
dir="$cache_root/$key"

have() { [[ -x "$dir/kube-apiserver" && -x "$dir/etcd" ]]; }

case "${1:-}" in
--print-dir) echo "$dir"; exit 0 ;;
--check) have; exit $? ;;
"") ;;
*) echo "usage: $0 [--print-dir|--check]" >&2; exit 2 ;;
esac

mkdir -p "$cache_root"
# One builder at a time: a second caller waits for the first and then reuses its result.
exec 9>"$cache_root/.lock"
flock 9

if have; then
	echo "control plane: reusing $dir" >&2
	echo "$dir"
	exit 0
fi

tmp="$(mktemp -d "$cache_root/.build.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT

build() { # build <wrapper dir> <package> <output name>
	local start=$SECONDS
	echo "control plane: building $3 ..." >&2
	(cd "$here/$1" && nice -n 19 "$go" build -trimpath -ldflags='-s -w' -o "$tmp/$3" "$2")
	echo "control plane: built $3 in $((SECONDS - start))s" >&2
}

build etcd . etcd
build apiserver k8s.io/kubernetes/cmd/kube-apiserver kube-apiserver

chmod 755 "$tmp" # mktemp made it private; tests may run as any user
mkdir -p "$(dirname "$dir")"
rm -rf "$dir"
mv "$tmp" "$dir"
trap - EXIT
echo "control plane: ready in $dir" >&2
echo "$dir"
