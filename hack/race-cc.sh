#!/usr/bin/env bash
# Checks that `go test -race` can build: the race detector needs cgo, so a
# C compiler (go env CC). Without one Go says only "-race requires cgo;
# enable cgo by setting CGO_ENABLED=1", and with that set, that the
# compiler is not found. `make unit` runs this first, and so does
# hack/test-deps.sh for a user who is not root (as root it installs gcc).
set -euo pipefail
go=${GO:-go}
cc="$("$go" env CC)"
if ! command -v "${cc%% *}" >/dev/null 2>&1; then
	echo "no C compiler (go env CC: ${cc:-empty}): go test -race needs one (cgo). Install gcc and the C library's headers" \
		"(Debian/Ubuntu: sudo apt-get install gcc libc6-dev), or run make test as root, which installs them." >&2
	exit 1
fi
