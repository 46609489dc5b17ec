#!/usr/bin/env bash
# Tests that the scripts the Makefile runs use the go command GO names (the
# Makefile's $(GO)), not the first go on PATH: each runs with GO set to a
# fake go that records its calls, and a go first on PATH that fails. Cheap
# (a second): test-deps.sh without the control plane, build.sh --print-dir
# (it builds nothing), race-cc.sh, staticcheck.sh. `make lint` runs it.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# The fake go: what each script asks of it, recorded in $work/calls. Its
# path has a space, as a GO the scripts must quote may.
fake="$work/fake go/go"
mkdir -p "$work/fake go" "$work/path" "$work/gopath/bin"
cat >"$fake" <<FAKE
#!/usr/bin/env bash
echo "\$*" >>"$work/calls"
case "\$*" in
version) echo "go version go0.0-fake linux/amd64" ;;
"env CC") echo sh ;;
"env GOPATH") echo "$work/gopath" ;;
"mod download") ;;
install\ *) printf '#!/bin/sh\n[ "\$1" = -version ] && echo "staticcheck (0.8.2)"\nexit 0\n' >"$work/gopath/bin/staticcheck"
	chmod +x "$work/gopath/bin/staticcheck" ;;
*) echo "fake go: unexpected: \$*" >&2; exit 1 ;;
esac
FAKE
# The go on PATH, which no script may run when GO is set.
cat >"$work/path/go" <<PATHGO
#!/usr/bin/env bash
echo "go on PATH: \$*" >>"$work/pathcalls"
exit 1
PATHGO
chmod +x "$fake" "$work/path/go"

failed=0
# expect NAME WANT CMD...: CMD exits 0, called the fake go with WANT (a
# line of its arguments) and never the go on PATH.
expect() {
	local name=$1 want=$2 rc=0
	shift 2
	: >"$work/calls"
	: >"$work/pathcalls"
	GO="$fake" PATH="$work/path:$PATH" "$@" >"$work/out" 2>&1 || rc=$?
	if [ "$rc" != 0 ] || ! grep -qx -- "$want" "$work/calls" || [ -s "$work/pathcalls" ]; then
		echo "gocmd_test.sh: $name: exit $rc; fake go's calls: $(tr '\n' ';' <"$work/calls"); $(cat "$work/pathcalls")" >&2
		sed 's/^/    /' "$work/out" >&2
		failed=1
	fi
}

expect "race-cc.sh" "env CC" "$here/race-cc.sh"
expect "controlplane build.sh --print-dir" "version" env KUP_CACHE="$work/cache" "$root/test/controlplane/build.sh" --print-dir
expect "staticcheck.sh" "env GOPATH" "$here/staticcheck.sh"
# As root, test-deps.sh installs what is missing: run it only where
# nothing is (a machine `make test` has prepared).
if [ "$(id -u)" != 0 ] || { command -v ip && command -v iptables-restore && command -v ip6tables-restore; } >/dev/null; then
	expect "test-deps.sh" "mod download" env KUP_SKIP_CONTROLPLANE=1 "$here/test-deps.sh"
	expect "test-deps.sh" "env CC" env KUP_SKIP_CONTROLPLANE=1 "$here/test-deps.sh"
else
	echo "gocmd_test.sh: test-deps.sh not run: it would install iproute2/iptables here" >&2
fi
exit $failed
