#!/usr/bin/env bash
# Tests hack/fuzz.sh with a fake go command (no fuzzing, a second): a
# target that passes, one that fails with only Go's own deadline report
# (passed over), one that writes a failing input (fails the run), and the
# deadline report together with a written input (fails). `make lint` runs it.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# The fake go: FAKE_GO_MODE says what the fuzz run does.
cat >"$work/go" <<'FAKE'
#!/usr/bin/env bash
pkg=${!#}
name=$(printf '%s\n' "$@" | sed -n 's/^-fuzz=\^\(.*\)\$$/\1/p')
case $FAKE_GO_MODE in
pass) echo PASS ;;
deadline)
	printf -- '--- FAIL: %s (31.06s)\n    context deadline exceeded\nFAIL\nexit status 1\n' "$name"
	exit 1 ;;
finding)
	mkdir -p "$pkg/testdata/fuzz/$name" && echo 'go test fuzz v1' >"$pkg/testdata/fuzz/$name/0123abcd"
	printf -- '--- FAIL: %s (3.00s)\n    fuzz_test.go:10: boom\nFAIL\n' "$name"
	exit 1 ;;
deadline-and-finding)
	mkdir -p "$pkg/testdata/fuzz/$name" && echo 'go test fuzz v1' >"$pkg/testdata/fuzz/$name/4567cdef"
	printf -- '--- FAIL: %s (31.06s)\n    context deadline exceeded\nFAIL\n' "$name"
	exit 1 ;;
esac
FAKE
chmod +x "$work/go"

failed=0
# expect MODE WANT: run fuzz.sh on one target in a fresh package directory.
expect() {
	local mode=$1 want=$2 got=0
	mkdir -p "$work/$mode"
	FAKE_GO_MODE=$mode GO="$work/go" "$here/fuzz.sh" 1s "FuzzThing:$work/$mode" >"$work/$mode.out" 2>&1 || got=$?
	if { [ "$want" = 0 ] && [ "$got" != 0 ]; } || { [ "$want" != 0 ] && [ "$got" = 0 ]; }; then
		echo "fuzz_test.sh: $mode: exit $got, want $([ "$want" = 0 ] && echo 0 || echo 'non-zero')" >&2
		sed 's/^/    /' "$work/$mode.out" >&2
		failed=1
	fi
}
expect pass 0
expect deadline 0
expect finding 1
expect deadline-and-finding 1
exit $failed
