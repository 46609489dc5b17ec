#!/usr/bin/env bash
# Runs staticcheck (pinned below) over every package, installing it into
# GOPATH/bin first when that version is missing. `make lint` runs it: it
# finds what go vet does not (unused code, expressions that are always
# true, a deprecated API used by mistake).
set -euo pipefail
cd "$(dirname "$0")/.."
version=v0.8.2 # honnef.co/go/tools; 0.8 builds with Go 1.26
go=${GO:-go}
bin="$("$go" env GOPATH)/bin/staticcheck"
# Both steps print nothing until they are done: say what runs, or `make
# lint` (and unit, test) sits silent for minutes after `go vet`.
if ! "$bin" -version 2>/dev/null | grep -q "(${version#v})"; then
	echo "staticcheck.sh: installing staticcheck ${version} into $(dirname "$bin") (once; its first build takes minutes)" >&2
	"$go" install "honnef.co/go/tools/cmd/staticcheck@${version}"
fi
echo "staticcheck ./... (a minute or two on 2 CPUs; it prints only what it finds)" >&2
"$bin" ./...
"$bin" -tags sockmap ./proxier
