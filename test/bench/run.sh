#!/usr/bin/env bash
# Side-by-side benchmark of kube-userspace-proxy against the kernel, HAProxy
# and nginx stream (`make bench`; not part of `make test`). Needs root.
#
# Topology, three network namespaces with random-suffix names, removed on exit:
#
#   client ns 10.79.11.2 ──▶ node ns (router; iptables; HAProxy; nginx; the proxy)
#                               10.79.11.1 │ 10.79.1.1
#                                          ▼
#                            backend ns 10.79.1.11/.12/.13: HTTP server,
#                            UDP echo on each; iperf3 -s on .11
#
# Configurations, measured alternately (A B C D E A B C D E ...) for every figure:
#   direct   client → 10.79.1.11 (one backend, routed through the node: the limit)
#   dnat     client → 10.96.0.10, kube-proxy iptables-mode rules (statistic random)
#   haproxy  client → 10.96.0.30 (on the node), mode tcp, roundrobin, splice-auto
#   nginx    client → 10.96.0.40 (on the node), stream module, TCP and UDP,
#            round robin, one worker per CPU with reuseport listeners
#   kup      client → 10.96.0.20, kube-userspace-proxy --manifests --bind-address 0.0.0.0
#            (its own portal rules REDIRECT to its proxy sockets)
#   kupel    the same with --data-path=eventloop (the process is restarted
#            whenever the data path changes)
# iperf3 services have one endpoint in every configuration (b1): iperf3's
# control and data connections must reach the same server.
#
# Environment: BENCH_DURATION (s per run, 8), BENCH_REPS (3), BENCH_IDLE_CONNS
# (10000), BENCH_PROFILE (1: perf profile of the proxy if perf works),
# BENCH_OUT (test/bench/results.md), BENCH_KUP_BIN (a prebuilt proxy binary to
# measure instead of building this tree's), BENCH_KUP_BASE_BIN (another build,
# e.g. of the commit before a change: measured as configuration "kupbase", on
# the event loop, alternated with the others in the same run, for a
# before/after that shares its runs' noise; add kupbase to BENCH_CONFIGS),
# BENCH_FIGURES (the figures to measure, of
# "newconn keepalive tcp1 tcp4 udp udpgso idle"; all by default; e.g. "udp" for a
# quick UDP comparison), BENCH_PERF_DIR (a directory to keep the perf data
# files of the profiles in, for a comparison by hand: perf report -i, perf
# diff). Only addresses inside the namespaces this
# script creates are ever sent traffic.
set -euo pipefail

DUR=${BENCH_DURATION:-8}
REPS=${BENCH_REPS:-3}
IDLE_CONNS=${BENCH_IDLE_CONNS:-10000}
PROFILE=${BENCH_PROFILE:-1}
NEWCONN_CONNS=${BENCH_NEWCONN_CONNS:-32}
read -r -a CONFIGS <<<"${BENCH_CONFIGS:-direct dnat haproxy nginx kup kupel}"
# Extra environment for the proxy alone (GOMAXPROCS=1, GODEBUG=...), for
# an A/B of runtime settings without touching the Go load generators.
read -r -a KUP_ENV <<<"${BENCH_KUP_ENV:-}"
FIGURES=${BENCH_FIGURES:-newconn keepalive tcp1 tcp4 udp udpgso idle}

if [ "$(id -u)" != 0 ]; then
	echo "run.sh: must run as root (network namespaces, iptables)" >&2
	exit 1
fi
# Relative paths the caller gave are the caller's, not the repository's.
[ -n "${BENCH_PERF_DIR:-}" ] && BENCH_PERF_DIR=$(realpath -m "$BENCH_PERF_DIR")
cd "$(dirname "$0")/../.."
ROOT=$PWD
OUT=${BENCH_OUT:-$ROOT/test/bench/results.md}
RAW_OUT=${OUT%.md}-raw.tsv

log() { printf '%s %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }

# --- tools -------------------------------------------------------------------
need=()
for t in wrk:wrk iperf3:iperf3 haproxy:haproxy ip:iproute2 iptables-restore:iptables bc:bc; do
	command -v "${t%%:*}" >/dev/null 2>&1 || need+=("${t#*:}")
done
# nginx with its stream module (Debian builds it as a dynamic module, in
# libnginx-mod-stream).
nginx_modules() { nginx -V 2>&1 | sed -nE 's/.*--modules-path=([^ ]+).*/\1/p'; }
if ! command -v nginx >/dev/null 2>&1; then
	need+=(nginx libnginx-mod-stream)
elif ! nginx -V 2>&1 | grep -qE -- '--with-stream( |$)' && [ ! -e "$(nginx_modules)/ngx_stream_module.so" ]; then
	need+=(libnginx-mod-stream)
fi
if [ ${#need[@]} -gt 0 ]; then
	log "installing ${need[*]}"
	apt-get update -qq
	# Debian's nginx and haproxy packages start their service on install
	# (port 80 of the machine): forbid that while we install, unless a
	# policy already says so.
	policy=
	if [ ! -e /usr/sbin/policy-rc.d ]; then
		policy=/usr/sbin/policy-rc.d
		printf '#!/bin/sh\nexit 101\n' >"$policy"
		chmod 755 "$policy"
	fi
	rc=0
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null || rc=$?
	[ -z "$policy" ] || rm -f "$policy"
	[ "$rc" = 0 ] || exit "$rc"
fi
if [ "$PROFILE" = 1 ] && ! command -v perf >/dev/null 2>&1; then
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends linux-perf >/dev/null 2>&1 || true
fi
GO=${GO:-go}
command -v "$GO" >/dev/null 2>&1 || GO=/usr/local/go/bin/go

# --- work dir, names, cleanup ------------------------------------------------
WORK=$(mktemp -d /tmp/kupb.XXXXXX)
SUF=$(od -An -N4 -tx1 /dev/urandom | tr -d ' \n')
NSC=kupb-cli-$SUF
NSN=kupb-node-$SUF
NSB=kupb-back-$SUF
PIDS=()
LASTPID=
NGINX_PID=

# ours PID: the process still runs inside one of our namespaces (so a PID
# that exited and was reused by someone else is never signalled).
ours() {
	local ns
	ns=$(ip netns identify "$1" 2>/dev/null) || return 1
	[ "$ns" = "$NSC" ] || [ "$ns" = "$NSN" ] || [ "$ns" = "$NSB" ]
}

# nginx_workers: the PIDs of the running nginx master's workers (they carry
# every connection; the master only starts them).
nginx_workers() {
	[ -n "$NGINX_PID" ] || return 0
	pgrep -P "$NGINX_PID" || true
}

cleanup() {
	set +e
	local workers
	workers=$(nginx_workers)
	for pid in "${PIDS[@]}"; do ours "$pid" && kill "$pid" 2>/dev/null; done
	sleep 0.5
	for pid in "${PIDS[@]}" $workers; do ours "$pid" && kill -9 "$pid" 2>/dev/null; done
	for ns in "$NSC" "$NSN" "$NSB"; do ip netns del "$ns" 2>/dev/null; done
	if [ -n "${BENCH_PERF_DIR:-}" ]; then
		mkdir -p "$BENCH_PERF_DIR" && cp "$WORK"/perf-*.data "$BENCH_PERF_DIR"/ 2>/dev/null
	fi
	rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# start NS NAME CMD...: run CMD in NS in the background; LASTPID is its PID
# (ip netns exec execs CMD, so the PID is CMD's own).
start() {
	local ns=$1 name=$2
	shift 2
	ip netns exec "$ns" "$@" >"$WORK/$name.log" 2>&1 &
	LASTPID=$!
	PIDS+=("$LASTPID")
}

# stop_pid PID: stop one process this script started and forget it.
stop_pid() {
	local pid=$1 p keep=()
	kill "$pid" 2>/dev/null || true
	for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
	kill -9 "$pid" 2>/dev/null || true
	wait "$pid" 2>/dev/null || true
	for p in "${PIDS[@]}"; do [ "$p" = "$pid" ] || keep+=("$p"); done
	PIDS=("${keep[@]}")
}

inc() { ip netns exec "$NSC" "$@"; }

# Descriptors for 10,000 idle proxied connections (2 sockets each, plus
# splice pipes) in the proxy, HAProxy, nginx and the client.
# Raising the hard limit needs CAP_SYS_RESOURCE; where it cannot be raised,
# the idle-connection count is cut to what fits: the proxy holds 6
# descriptors per idle connection (2 sockets and, while its splice waits for
# data, 2 pipes), HAProxy 2.5 by its own accounting (maxconn × 2 + pipes).
ulimit -Hn 1048576 2>/dev/null || true
ulimit -Sn "$(ulimit -Hn)"
FD_LIMIT=$(ulimit -Hn)
HAPROXY_MAXCONN=$(((FD_LIMIT - 200) * 2 / 5))
[ "$HAPROXY_MAXCONN" -gt 60000 ] && HAPROXY_MAXCONN=60000
IDLE_NOTE=
fit=$(((FD_LIMIT - 200) / 6))
[ "$fit" -gt "$((HAPROXY_MAXCONN - 10))" ] && fit=$((HAPROXY_MAXCONN - 10))
if [ "$IDLE_CONNS" -gt "$fit" ]; then
	IDLE_NOTE="cut from $IDLE_CONNS to $fit: the descriptor hard limit is $FD_LIMIT and cannot be raised here"
	log "idle connections $IDLE_NOTE"
	IDLE_CONNS=$fit
fi
# nginx's connections per worker: reuseport may hand one worker most of the
# idle connections, each of which is 2 (client and upstream).
NGINX_WORKER_CONNS=$((2 * IDLE_CONNS + 1024))

# --- build -------------------------------------------------------------------
log "building kube-userspace-proxy and benchtool"
if [ -n "${BENCH_KUP_BIN:-}" ]; then
	# Another build (e.g. of an earlier commit), for a before/after whose
	# ratios to the kernel come from runs on the same machine.
	cp "$BENCH_KUP_BIN" "$WORK/kube-userspace-proxy"
else
	"$GO" build -o "$WORK/kube-userspace-proxy" ./cmd/kube-userspace-proxy
fi
"$GO" build -o "$WORK/benchtool" ./test/bench/benchtool
BT=$WORK/benchtool
case " ${CONFIGS[*]} " in
*" kupbase "*)
	if [ -z "${BENCH_KUP_BASE_BIN:-}" ]; then
		echo "run.sh: configuration kupbase needs BENCH_KUP_BASE_BIN (the build to compare with)" >&2
		exit 1
	fi
	cp "$BENCH_KUP_BASE_BIN" "$WORK/kube-userspace-proxy-base"
	;;
esac

# --- topology ----------------------------------------------------------------
log "namespaces $NSC $NSN $NSB"
for ns in "$NSC" "$NSN" "$NSB"; do
	ip netns add "$ns"
	ip -n "$ns" link set lo up
	ip netns exec "$ns" sysctl -qw net.ipv4.ip_local_port_range="1024 65535" net.ipv4.tcp_tw_reuse=1
done
ip -n "$NSC" link add eth0 type veth peer name kc0 netns "$NSN"
ip -n "$NSN" link add kb0 type veth peer name eth0 netns "$NSB"
ip -n "$NSC" addr add 10.79.11.2/24 dev eth0
ip -n "$NSN" addr add 10.79.11.1/24 dev kc0
ip -n "$NSN" addr add 10.79.1.1/24 dev kb0
for a in 2 11 12 13; do ip -n "$NSB" addr add "10.79.1.$a/24" dev eth0; done
for l in "$NSC eth0" "$NSN kc0" "$NSN kb0" "$NSB eth0"; do
	set -- $l
	ip -n "$1" link set "$2" up
done
ip -n "$NSC" route add default via 10.79.11.1
ip -n "$NSB" route add default via 10.79.1.1
# The node's default route points at the backends side, so its node IP (the
# proxy's OUTPUT DNAT target) is 10.79.1.1.
ip -n "$NSN" route add default via 10.79.1.2
ip -n "$NSN" addr add 10.96.0.30/32 dev lo # HAProxy's service address
ip -n "$NSN" addr add 10.96.0.40/32 dev lo # nginx's service address
ip netns exec "$NSN" sysctl -qw net.ipv4.ip_forward=1

BACKENDS=(10.79.1.11 10.79.1.12 10.79.1.13)
for i in 0 1 2; do
	start "$NSB" "http$i" "$BT" http -addr "${BACKENDS[$i]}:80"
	start "$NSB" "udp$i" "$BT" udp-echo -addr "${BACKENDS[$i]}:5353"
done
start "$NSB" iperf3-server iperf3 -s -B 10.79.1.11 -p 5201

# --- kernel DNAT as kube-proxy's iptables mode writes it ---------------------
sep_rules() { # CHAIN SVC PROTO IP PORT
	printf -- '-A %s -s %s/32 -m comment --comment %s -j KUBE-MARK-MASQ\n' "$1" "$4" "$2"
	printf -- '-A %s -p %s -m comment --comment %s -m %s -j DNAT --to-destination %s:%s\n' "$1" "$3" "$2" "$3" "$4" "$5"
}
svc_rules() { # NAME PROTO PORT ENDPOINT...
	local name=$1 proto=$2 port=$3
	shift 3
	local chain=KUBE-SVC-${name^^} n=$# i=0 ep
	printf -- '-A KUBE-SERVICES -d 10.96.0.10/32 -p %s -m comment --comment "bench/%s cluster IP" -m %s --dport %s -j %s\n' "$proto" "$name" "$proto" "$port" "$chain"
	printf -- '-A %s ! -s 10.79.0.0/16 -d 10.96.0.10/32 -p %s -m comment --comment "bench/%s cluster IP" -m %s --dport %s -j KUBE-MARK-MASQ\n' "$chain" "$proto" "$name" "$proto" "$port"
	for ep in "$@"; do
		i=$((i + 1))
		local sep=KUBE-SEP-${name^^}$i
		if [ "$i" -lt "$n" ]; then
			printf -- '-A %s -m comment --comment "bench/%s -> %s:%s" -m statistic --mode random --probability %.11f -j %s\n' "$chain" "$name" "$ep" "$port" "$(echo "1/($n-$i+1)" | bc -l)" "$sep"
		else
			printf -- '-A %s -m comment --comment "bench/%s -> %s:%s" -j %s\n' "$chain" "$name" "$ep" "$port" "$sep"
		fi
		sep_rules "$sep" "bench/$name" "$proto" "$ep" "$port"
	done
}
{
	echo '*nat'
	for c in KUBE-SERVICES KUBE-POSTROUTING KUBE-MARK-MASQ KUBE-SVC-HTTP KUBE-SVC-IPERF KUBE-SVC-ECHO \
		KUBE-SEP-HTTP1 KUBE-SEP-HTTP2 KUBE-SEP-HTTP3 KUBE-SEP-IPERF1 KUBE-SEP-ECHO1 KUBE-SEP-ECHO2 KUBE-SEP-ECHO3; do
		echo ":$c - [0:0]"
	done
	echo '-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES'
	echo '-A OUTPUT -m comment --comment "kubernetes service portals" -j KUBE-SERVICES'
	echo '-A POSTROUTING -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING'
	echo '-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000'
	echo '-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN'
	echo '-A KUBE-POSTROUTING -j MARK --xor-mark 0x4000'
	echo '-A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE --random-fully'
	svc_rules http tcp 80 "${BACKENDS[@]}"
	svc_rules iperf tcp 5201 10.79.1.11
	svc_rules echo udp 5353 "${BACKENDS[@]}"
	echo COMMIT
} >"$WORK/dnat.rules"
ip netns exec "$NSN" iptables-restore --noflush <"$WORK/dnat.rules"
# New-connection runs leave many TIME_WAIT entries; keep the table small.
ip netns exec "$NSN" sysctl -qw net.netfilter.nf_conntrack_tcp_timeout_time_wait=10 2>/dev/null || true

# --- HAProxy -----------------------------------------------------------------
cat >"$WORK/haproxy.cfg" <<EOF
global
    maxconn $HAPROXY_MAXCONN
    log stdout format raw local0 emerg
defaults
    mode tcp
    option splice-auto
    timeout connect 2s
    timeout client 15m
    timeout server 15m
frontend http
    bind 10.96.0.30:80
    default_backend http
backend http
    balance roundrobin
    server b1 10.79.1.11:80
    server b2 10.79.1.12:80
    server b3 10.79.1.13:80
frontend iperf
    bind 10.96.0.30:5201
    default_backend iperf
backend iperf
    server b1 10.79.1.11:5201
EOF
HAPROXY_PID=
start_haproxy() {
	start "$NSN" haproxy haproxy -db -f "$WORK/haproxy.cfg"
	HAPROXY_PID=$LASTPID
}

# --- nginx stream ------------------------------------------------------------
# Round robin (nginx's default) over the 3 backends for HTTP and UDP echo, the
# one backend for iperf3; one worker per CPU, each with its own reuseport
# socket per listener; no access log. proxy_responses 1: a UDP session ends
# once every datagram it forwarded is answered (request/response, as DNS).
NGINX_LOAD=
if nginx -V 2>&1 | grep -q -- '--with-stream=dynamic'; then
	NGINX_LOAD="load_module $(nginx_modules)/ngx_stream_module.so;"
fi
mkdir -p "$WORK/nginx"
cat >"$WORK/nginx.conf" <<EOF
$NGINX_LOAD
worker_processes auto;
worker_rlimit_nofile $FD_LIMIT;
pid $WORK/nginx/nginx.pid;
error_log stderr error;
events {
    worker_connections $NGINX_WORKER_CONNS;
}
stream {
    access_log off;
    proxy_connect_timeout 2s;
    upstream http_backends {
        server 10.79.1.11:80;
        server 10.79.1.12:80;
        server 10.79.1.13:80;
    }
    upstream iperf_backend {
        server 10.79.1.11:5201;
    }
    upstream echo_backends {
        server 10.79.1.11:5353;
        server 10.79.1.12:5353;
        server 10.79.1.13:5353;
    }
    server {
        listen 10.96.0.40:80 reuseport;
        proxy_pass http_backends;
        proxy_timeout 15m;
    }
    server {
        listen 10.96.0.40:5201 reuseport;
        proxy_pass iperf_backend;
        proxy_timeout 15m;
    }
    server {
        listen 10.96.0.40:5353 udp reuseport;
        proxy_pass echo_backends;
        proxy_responses 1;
        proxy_timeout 10s;
    }
}
EOF
# -e: nginx opens its error log before it reads the configuration.
start_nginx() {
	start "$NSN" nginx nginx -p "$WORK/nginx/" -e stderr -c "$WORK/nginx.conf" -g 'daemon off;'
	NGINX_PID=$LASTPID
}
# stop_nginx: stop the master (it stops its workers); a worker that outlives
# it is killed by PID.
stop_nginx() {
	local workers w
	workers=$(nginx_workers)
	stop_pid "$NGINX_PID"
	NGINX_PID=
	for w in $workers; do ours "$w" && kill -9 "$w" 2>/dev/null; done
	return 0
}

# --- kube-userspace-proxy ----------------------------------------------------
mkdir -p "$WORK/manifests"
cat >"$WORK/manifests/bench.yaml" <<'EOF'
apiVersion: v1
kind: Service
metadata: {name: web, namespace: bench}
spec:
  type: ClusterIP
  clusterIP: 10.96.0.20
  ports:
  - {name: http, port: 80, targetPort: 80, protocol: TCP}
  - {name: echo, port: 5353, targetPort: 5353, protocol: UDP}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-1
  namespace: bench
  labels: {kubernetes.io/service-name: web}
addressType: IPv4
ports:
- {name: http, port: 80, protocol: TCP}
- {name: echo, port: 5353, protocol: UDP}
endpoints:
- {addresses: [10.79.1.11], conditions: {ready: true}}
- {addresses: [10.79.1.12], conditions: {ready: true}}
- {addresses: [10.79.1.13], conditions: {ready: true}}
---
apiVersion: v1
kind: Service
metadata: {name: iperf, namespace: bench}
spec:
  type: ClusterIP
  clusterIP: 10.96.0.21
  ports:
  - {name: iperf, port: 5201, targetPort: 5201, protocol: TCP}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: iperf-1
  namespace: bench
  labels: {kubernetes.io/service-name: iperf}
addressType: IPv4
ports:
- {name: iperf, port: 5201, protocol: TCP}
endpoints:
- {addresses: [10.79.1.11], conditions: {ready: true}}
EOF
# kup and kupel are the same process on the same addresses, started with
# --data-path=goroutines or =eventloop (kupbase: BENCH_KUP_BASE_BIN's build on
# the event loop, or on BENCH_KUP_BASE_PATH): use_kup restarts it when the next
# measurement needs another one.
KUP_PID=
KUP_CFG=
start_kup() { # [CFG]
	local path=goroutines bin=$WORK/kube-userspace-proxy
	KUP_CFG=${1:-kup}
	[ "$KUP_CFG" = kupel ] && path=eventloop
	[ "$KUP_CFG" = kupbase ] && path=${BENCH_KUP_BASE_PATH:-eventloop} bin=$WORK/kube-userspace-proxy-base
	start "$NSN" kup env ${KUP_ENV[@]+"${KUP_ENV[@]}"} "$bin" --manifests "$WORK/manifests" --bind-address 0.0.0.0 \
		--healthz-bind-address 127.0.0.1:10256 --metrics-bind-address 127.0.0.1:10249 --data-path "$path"
	KUP_PID=$LASTPID
}
use_kup() { # CFG: no-op for other configurations
	case $1 in kup | kupel | kupbase) ;; *) return 0 ;; esac
	[ "$KUP_CFG" = "$1" ] && return 0
	stop_pid "$KUP_PID"
	start_kup "$1"
	wait_http "$1"
	wait_udp "$1"
}

# --- targets per configuration -----------------------------------------------
http_target() { case $1 in direct) echo 10.79.1.11:80 ;; dnat) echo 10.96.0.10:80 ;; haproxy) echo 10.96.0.30:80 ;; nginx) echo 10.96.0.40:80 ;; kup | kupel | kupbase) echo 10.96.0.20:80 ;; esac; }
iperf_host() { case $1 in direct) echo 10.79.1.11 ;; dnat) echo 10.96.0.10 ;; haproxy) echo 10.96.0.30 ;; nginx) echo 10.96.0.40 ;; kup | kupel | kupbase) echo 10.96.0.21 ;; esac; }
udp_target() { case $1 in direct) echo 10.79.1.11:5353 ;; dnat) echo 10.96.0.10:5353 ;; nginx) echo 10.96.0.40:5353 ;; kup | kupel | kupbase) echo 10.96.0.20:5353 ;; *) echo "" ;; esac; }
# proc_pids CFG: the processes that carry CFG's connections, whose CPU, RSS
# and descriptors are summed: HAProxy's and the proxy's one process, nginx's
# workers (not the master, which carries none).
proc_pids() {
	case $1 in
	haproxy) echo "$HAPROXY_PID" ;;
	nginx) nginx_workers | tr '\n' ' ' ;;
	kup | kupel | kupbase) echo "$KUP_PID" ;;
	*) echo "" ;;
	esac
}

wait_http() { # CFG: until one request through it succeeds (20 s)
	local t
	t=$(http_target "$1")
	for _ in $(seq 100); do
		if inc "$BT" idle -target "$t" -conns 1 -hold 0s 2>/dev/null | grep -q '^READY 1 0'; then return 0; fi
		sleep 0.2
	done
	echo "run.sh: $1 ($t) does not answer; logs in $WORK" >&2
	tail -n 20 "$WORK"/*.log >&2 || true
	return 1
}

wait_udp() { # CFG
	local t
	t=$(udp_target "$1")
	[ -n "$t" ] || return 0
	for _ in $(seq 50); do
		if inc "$BT" udp-load -target "$t" -flows 1 -window 1 -duration 100ms -timeout 100ms 2>/dev/null | awk 'NF == 2 && $2 < 100 {ok = 1} END {exit !ok}'; then return 0; fi
		sleep 0.2
	done
	echo "run.sh: UDP through $1 ($t) does not answer" >&2
	return 1
}

# Sums over PID...: utime+stime in clock ticks, VmRSS in KiB, open descriptors.
cpu_ticks() {
	local p t=0
	for p; do t=$((t + $(awk '{print $14 + $15}' "/proc/$p/stat"))); done
	echo "$t"
}
rss_kib() {
	local p t=0
	for p; do t=$((t + $(awk '/^VmRSS:/ {print $2}' "/proc/$p/status"))); done
	echo "$t"
}
fd_count() {
	local p t=0
	for p; do t=$((t + $(ls "/proc/$p/fd" | wc -l))); done
	echo "$t"
}
CLK_TCK=$(getconf CLK_TCK)
# machine_ticks: the whole machine's idle and total CPU ticks (/proc/stat
# is not per namespace).
# (printf: mawk prints sums above 2^31 in exponent form, which test -gt refuses.)
machine_ticks() { awk '/^cpu / {printf "%.0f %.0f\n", $5 + $6, $2 + $3 + $4 + $5 + $6 + $7 + $8 + $9}' /proc/stat; }

RAW=$WORK/raw.tsv
echo "# figure config rep value" >"$RAW"
record() { printf '%s %s %s %s\n' "$1" "$2" "$3" "$4" >>"$RAW"; }

# --- measurements ------------------------------------------------------------
# record_idle FIGURE CFG REP "IDLE0 TOTAL0" "IDLE1 TOTAL1": the share of the
# machine's CPU time left idle over the run, in %. A closed-loop load that
# keeps every CPU busy leaves ~0; more means the chain of wake-ups through
# the configuration left CPUs waiting.
record_idle() {
	local i0 t0 i1 t1
	read -r i0 t0 <<<"$4"
	read -r i1 t1 <<<"$5"
	if [ "$t1" -gt "$t0" ]; then
		record "$1" "$2" "$3" "$(echo "100 * ($i1 - $i0) / ($t1 - $t0)" | bc -l)"
	fi
}
# record_cpu_per_request FIGURE CFG REP RATE T0 T1: the proxy's CPU (ticks
# T0..T1 over the run) per request at RATE req/s, in µs; NA where no
# process carries the configuration (direct, DNAT: softirq, charged to none).
record_cpu_per_request() {
	if [ -n "$5" ] && [ -n "$6" ]; then
		record "$1" "$2" "$3" "$(echo "($6 - $5) / $CLK_TCK * 1000000 / ($4 * $DUR)" | bc -l)"
	else
		record "$1" "$2" "$3" NA
	fi
}

measure_newconn() { # CFG REP
	local r pids t0= t1= m0 m1
	pids=$(proc_pids "$1")
	[ -n "$pids" ] && t0=$(cpu_ticks $pids)
	m0=$(machine_ticks)
	inc wrk -t2 -c"$NEWCONN_CONNS" -d"${DUR}s" --latency -H 'Connection: close' "http://$(http_target "$1")/" >"$WORK/wrk.out" 2>&1 || true
	m1=$(machine_ticks)
	[ -n "$pids" ] && t1=$(cpu_ticks $pids)
	if r=$("$BT" wrk "$WORK/wrk.out"); then
		set -- "$1" "$2" $r
		record newconn_rps "$1" "$2" "$3"
		record newconn_p50 "$1" "$2" "$4"
		record newconn_p99 "$1" "$2" "$5"
		record newconn_err "$1" "$2" "$6"
		record_cpu_per_request newconn_cpu_us "$1" "$2" "$3" "$t0" "$t1"
		record_idle newconn_idle "$1" "$2" "$m0" "$m1"
	else
		log "newconn $1: wrk failed: $(tail -n 3 "$WORK/wrk.out" | tr '\n' ' ')"
	fi
}

measure_keepalive() { # CFG REP
	local r pids t0= t1= m0 m1
	pids=$(proc_pids "$1")
	[ -n "$pids" ] && t0=$(cpu_ticks $pids)
	m0=$(machine_ticks)
	inc wrk -t2 -c64 -d"${DUR}s" --latency "http://$(http_target "$1")/" >"$WORK/wrk.out" 2>&1 || true
	m1=$(machine_ticks)
	[ -n "$pids" ] && t1=$(cpu_ticks $pids)
	if r=$("$BT" wrk "$WORK/wrk.out"); then
		set -- "$1" "$2" $r
		record keepalive_rps "$1" "$2" "$3"
		record keepalive_p99 "$1" "$2" "$5"
		record keepalive_err "$1" "$2" "$6"
		record_cpu_per_request keepalive_cpu_us "$1" "$2" "$3" "$t0" "$t1"
		record_idle keepalive_idle "$1" "$2" "$m0" "$m1"
	else
		log "keepalive $1: wrk failed: $(tail -n 3 "$WORK/wrk.out" | tr '\n' ' ')"
	fi
}

measure_iperf() { # CFG REP STREAMS
	local pids t0 t1 r m0 m1
	pids=$(proc_pids "$1")
	[ -n "$pids" ] && t0=$(cpu_ticks $pids)
	m0=$(machine_ticks)
	inc iperf3 -c "$(iperf_host "$1")" -p 5201 -t "$DUR" -P "$3" -J >"$WORK/iperf.json" 2>&1 || true
	m1=$(machine_ticks)
	[ -n "$pids" ] && t1=$(cpu_ticks $pids)
	if r=$("$BT" iperf "$WORK/iperf.json"); then
		set -- "$1" "$2" "$3" $r
		record "tcp${3}_gbps" "$1" "$2" "$4"
		record_idle "tcp${3}_idle" "$1" "$2" "$m0" "$m1"
		if [ -n "$pids" ]; then
			record "cpu_per_gb${3}" "$1" "$2" "$(echo "($t1 - $t0) / $CLK_TCK / ($5 / 1000000000)" | bc -l)"
		else
			record "cpu_per_gb${3}" "$1" "$2" NA
		fi
	else
		log "iperf $1 -P $3: failed"
	fi
}

# UDP_LOADS are the udp-load flags of each UDP figure: DNS-like single
# datagrams, and bursts of 16 datagrams of 1,200 bytes sent as one GSO
# buffer (as QUIC stacks send), one burst in flight per flow.
declare -A UDP_LOADS=(
	[udp]="-flows 16 -window 4"
	[udpgso]="-flows 8 -window 16 -gso 16 -size 1200"
)

measure_udp() { # CFG REP FIGURE
	local t r pids t0= t1= m0 m1 fig=${3:-udp}
	t=$(udp_target "$1")
	if [ -z "$t" ]; then
		record "${fig}_rps" "$1" "$2" NA
		return
	fi
	pids=$(proc_pids "$1")
	[ -n "$pids" ] && t0=$(cpu_ticks $pids)
	m0=$(machine_ticks)
	# shellcheck disable=SC2086 # the flags split on purpose
	if r=$(inc "$BT" udp-load -target "$t" ${UDP_LOADS[$fig]} -duration "${DUR}s" 2>>"$WORK/udp-load.log"); then
		m1=$(machine_ticks)
		[ -n "$pids" ] && t1=$(cpu_ticks $pids)
		set -- "$1" "$2" $r
		record "${fig}_rps" "$1" "$2" "$3"
		record "${fig}_loss" "$1" "$2" "$4"
		# Proxy CPU per round trip (a datagram each way), in µs.
		record_cpu_per_request "${fig}_cpu_us" "$1" "$2" "$3" "$t0" "$t1"
		record_idle "${fig}_idle" "$1" "$2" "$m0" "$m1"
	else
		log "$fig $1: failed"
	fi
}

# measure_idle CFG REP: restart the process (so freed memory of an earlier
# run cannot be reused), open IDLE_CONNS keep-alive connections through it,
# each with one completed request, and take the RSS growth per connection.
measure_idle() {
	local cfg=$1 rep=$2 pids before after fds_before fds_after line ok idle_pid
	case $cfg in
	haproxy) stop_pid "$HAPROXY_PID"; start_haproxy ;;
	nginx) stop_nginx; start_nginx ;;
	kup | kupel | kupbase) stop_pid "$KUP_PID"; start_kup "$cfg" ;;
	*)
		record rss_idle_kib "$cfg" "$rep" NA
		record fds_idle "$cfg" "$rep" NA
		return
		;;
	esac
	wait_http "$cfg"
	sleep 1
	pids=$(proc_pids "$cfg")
	before=$(rss_kib $pids)
	fds_before=$(fd_count $pids)
	start "$NSC" idle "$BT" idle -target "$(http_target "$cfg")" -conns "$IDLE_CONNS" -hold 10m
	idle_pid=$LASTPID
	line=
	for _ in $(seq 600); do
		line=$(grep -m1 '^READY' "$WORK/idle.log" || true)
		[ -n "$line" ] && break
		sleep 0.5
	done
	sleep 2
	after=$(rss_kib $pids)
	fds_after=$(fd_count $pids)
	stop_pid "$idle_pid"
	ok=$(echo "$line" | awk '{print $2}')
	if [ -z "$ok" ] || [ "$ok" = 0 ]; then
		log "idle $cfg: no connection held: $(tail -n 2 "$WORK/idle.log")"
		return
	fi
	[ "$ok" -lt "$IDLE_CONNS" ] && log "idle $cfg: only $ok of $IDLE_CONNS connections held"
	record rss_idle_kib "$cfg" "$rep" "$(echo "($after - $before) / $ok" | bc -l)"
	record fds_idle "$cfg" "$rep" "$(echo "($fds_after - $fds_before) / $ok" | bc -l)"
}

# --- run ---------------------------------------------------------------------
start_haproxy
start_nginx
start_kup
for c in "${CONFIGS[@]}"; do wait_http "$c"; wait_udp "$c"; done
log "all ${#CONFIGS[@]} configurations answer; ${REPS} reps of ${DUR}s per figure"

LOAD_START=$(cut -d' ' -f1-3 /proc/loadavg)
T_START=$(date +%s)
for fig in $FIGURES; do
	[ "$fig" != idle ] || continue
	for rep in $(seq "$REPS"); do
		for cfg in "${CONFIGS[@]}"; do
			log "$fig rep $rep/$REPS: $cfg"
			use_kup "$cfg"
			case $fig in
			newconn) measure_newconn "$cfg" "$rep" ;;
			keepalive) measure_keepalive "$cfg" "$rep" ;;
			tcp1) measure_iperf "$cfg" "$rep" 1 ;;
			tcp4) measure_iperf "$cfg" "$rep" 4 ;;
			udp | udpgso) measure_udp "$cfg" "$rep" "$fig" ;;
			esac
			sleep 1
		done
	done
done
case " $FIGURES " in *" idle "*)
	for rep in $(seq "$REPS"); do
		for cfg in "${CONFIGS[@]}"; do
			log "idle connections rep $rep/$REPS: $cfg"
			measure_idle "$cfg" "$rep"
		done
	done
	;;
esac

# --- CPU profile of the proxy under load --------------------------------------
PROFILES=
PROF_CFG=kup
if [ "$PROFILE" = 1 ] && command -v perf >/dev/null 2>&1; then
	# The default data path, unless this run left it out.
	PROF_CFG=kupel
	case " ${CONFIGS[*]} " in *" kupel "*) ;; *) PROF_CFG=kup ;; esac
	use_kup "$PROF_CFG"
	trim() { sed -E 's/[[:space:]]+-[[:space:]]+-[[:space:]]*$//; s/[[:space:]]+$//'; }
	profile() { # NAME LOAD-CMD...
		local name=$1
		shift
		perf record -q -F 499 -g -p "$KUP_PID" -o "$WORK/perf-$name.data" -- sleep "$DUR" >/dev/null 2>&1 &
		local perf_pid=$!
		"$@" >/dev/null 2>&1 || true
		wait "$perf_pid" || true
		local data=$WORK/perf-$name.data
		{
			echo
			echo "### under the $name load"
			echo
			echo "Where the time goes (perf --sort dso):"
			echo '```'
			perf report -i "$data" --stdio --no-children --sort dso -g none 2>/dev/null | grep -E '^ +[0-9]' | head -n 5 | trim || true
			echo '```'
			echo "Self time, top symbols (user [.] and kernel [k]; on this VM, time spent with interrupts"
			echo "off — softirq network processing — is charged to pvm_irq_enable):"
			echo '```'
			perf report -i "$data" --stdio --no-children --sort symbol -g none --percent-limit 0.8 2>/dev/null |
				grep -E '^ +[0-9]' | head -n 20 | trim || true
			echo '```'
			echo "Including callees, the proxy's own functions (Go call chains, frame pointers):"
			echo '```'
			perf report -i "$data" --stdio --children --sort symbol -g none 2>/dev/null |
				grep -E '^ +[0-9].*\[\.\] (github.com|net\.|internal/poll|syscall\.|runtime\.(mallocgc|gcBgMarkWorker|schedule|findRunnable)|os\.)' |
				head -n 25 | trim || true
			echo '```'
			echo "Time inside each system call, including the kernel work it triggers (callees):"
			echo '```'
			syscall_split "$data"
			echo '```'
		} >>"$WORK/profiles.md"
	}
	# syscall_split DATA: share of the profile under each system call's
	# kernel entry point (__x64_sys_*, __sys_* inlined ones folded in).
	syscall_split() {
		perf report -i "$1" --stdio --children --sort symbol -g none 2>/dev/null |
			grep -E '\[k\] __x64_sys_' | head -n 14 | trim || true
	}
	# peer_profile CFG LOAD-CMD...: the same system-call split for a peer
	# proxy (HAProxy, nginx's workers) under the same load.
	peer_profile() {
		local cfg=$1 pids
		shift
		pids=$(proc_pids "$cfg" | tr -s ' ' ',' | sed 's/,$//')
		[ -n "$pids" ] || return 0
		perf record -q -F 499 -g -p "$pids" -o "$WORK/perf-$cfg.data" -- sleep "$DUR" >/dev/null 2>&1 &
		local perf_pid=$!
		"$@" >/dev/null 2>&1 || true
		wait "$perf_pid" || true
		{
			echo
			echo "### $cfg under the new-connection load, for comparison"
			echo
			echo "Where the time goes (perf --sort dso):"
			echo '```'
			perf report -i "$WORK/perf-$cfg.data" --stdio --no-children --sort dso -g none 2>/dev/null | grep -E '^ +[0-9]' | head -n 5 | trim || true
			echo '```'
			echo "Time inside each system call, including the kernel work it triggers (callees):"
			echo '```'
			syscall_split "$WORK/perf-$cfg.data"
			echo '```'
		} >>"$WORK/profiles.md"
	}
	log "profiling the proxy under the new-connection load"
	profile new-connection inc wrk -t2 -c"$NEWCONN_CONNS" -d"${DUR}s" -H 'Connection: close' "http://$(http_target kup)/"
	for peer in haproxy nginx; do
		case " ${CONFIGS[*]} " in *" $peer "*) ;; *) continue ;; esac
		log "profiling $peer under the new-connection load"
		peer_profile "$peer" inc wrk -t2 -c"$NEWCONN_CONNS" -d"${DUR}s" -H 'Connection: close' "http://$(http_target "$peer")/"
	done
	log "profiling the proxy under the UDP load"
	profile UDP inc "$BT" udp-load -target "$(udp_target kup)" -flows 16 -window 4 -duration "${DUR}s"
	PROFILES=$(cat "$WORK/profiles.md")
fi
# --- what each request costs each proxy (perf stat) ---------------------------
# Counted over every process that carries the configuration (nginx: its
# workers), while one load runs, and divided by the requests it completed:
# system calls, context switches and CPU time (perf's task-clock). This is
# the figure that says whether a proxy does more work per request or is
# only slowed by sharing 2 CPUs with its load generator.
COSTS=
if { [ "$PROFILE" = 1 ] || [ "$PROFILE" = costs ]; } && command -v perf >/dev/null 2>&1 &&
	perf stat -e raw_syscalls:sys_enter -p $$ -- true >/dev/null 2>&1; then
	# cost_row CFG LOAD: runs LOAD's generator against CFG once, prints a row.
	cost_row() {
		local cfg=$1 load=$2 pids rate stat
		pids=$(proc_pids "$cfg" | tr -s ' ' ',' | sed 's/,$//')
		[ -n "$pids" ] || return 0
		perf stat -x, -e raw_syscalls:sys_enter,context-switches,task-clock -p "$pids" -o "$WORK/stat.csv" -- sleep "$DUR" >/dev/null 2>&1 &
		local perf_pid=$!
		case $load in
		new-connection)
			inc wrk -t2 -c"$NEWCONN_CONNS" -d"${DUR}s" -H 'Connection: close' "http://$(http_target "$cfg")/" >"$WORK/wrk.out" 2>&1 || true
			rate=$("$BT" wrk "$WORK/wrk.out" | cut -d' ' -f1) || rate=
			;;
		keep-alive)
			inc wrk -t2 -c64 -d"${DUR}s" "http://$(http_target "$cfg")/" >"$WORK/wrk.out" 2>&1 || true
			rate=$("$BT" wrk "$WORK/wrk.out" | cut -d' ' -f1) || rate=
			;;
		UDP)
			[ -n "$(udp_target "$cfg")" ] || { wait "$perf_pid" || true; return 0; }
			rate=$(inc "$BT" udp-load -target "$(udp_target "$cfg")" -flows 16 -window 4 -duration "${DUR}s" 2>/dev/null | cut -d' ' -f1) || rate=
			;;
		esac
		wait "$perf_pid" || true
		[ -n "$rate" ] || return 0
		awk -F, -v cfg="$cfg" -v load="$load" -v n="$(echo "$rate * $DUR" | bc -l)" '
			$3 == "raw_syscalls:sys_enter" {sc = $1}
			$3 == "context-switches" {cs = $1}
			$3 == "task-clock" {ms = $1}
			END {if (n > 0) printf "| %s | %s | %.0f | %.1f | %.2f | %.1f |\n", load, cfg, n / 1000, sc / n, cs / n, ms * 1000 / n}
		' "$WORK/stat.csv"
	}
	log "counting system calls and context switches per request"
	{
		echo "| load | proxy | requests (k) | system calls per request | context switches per request | CPU per request (µs) |"
		echo "|---|---|---|---|---|---|"
		for load in new-connection keep-alive UDP; do
			case $load in new-connection) fig=newconn ;; keep-alive) fig=keepalive ;; UDP) fig=udp ;; esac
			case " $FIGURES " in *" $fig "*) ;; *) continue ;; esac
			for cfg in "${CONFIGS[@]}"; do
				case $cfg in haproxy | nginx | kup | kupel | kupbase) use_kup "$cfg"; cost_row "$cfg" "$load" ;; esac
			done
		done
	} >"$WORK/costs.md"
	COSTS=$(cat "$WORK/costs.md")
fi
T_END=$(date +%s)
LOAD_END=$(cut -d' ' -f1-3 /proc/loadavg)

# --- report ------------------------------------------------------------------
TABLE=$("$BT" table "$RAW")
{
	echo "# kube-userspace-proxy side-by-side benchmark"
	echo
	echo "Generated by \`make bench\` (test/bench/run.sh); median of $REPS runs of ${DUR}s with (min–max),"
	echo "configurations alternated A B C D E for every figure. Ratios are of medians."
	echo
	echo "- date: $(date -u '+%Y-%m-%d %H:%M UTC'), measuring took $(((T_END - T_START) / 60)) min"
	echo "- kernel: $(uname -r), $(nproc) CPUs ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')), load average at start $LOAD_START, at end $LOAD_END"
	dirty=$(git -C "$ROOT" status --porcelain -- cmd proxier iptables loadbalancer 2>/dev/null | grep -cv '_test\.go$' || true)
	echo "- kube-userspace-proxy: $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)${dirty:+$([ "$dirty" -gt 0 ] && echo " + $dirty uncommitted source files")}, $("$GO" version | cut -d' ' -f3-)"
	echo "- wrk: $(wrk -v 2>&1 | head -n1 | cut -d' ' -f1-2); iperf3: $(iperf3 -v | head -n1 | cut -d' ' -f2); HAProxy: $(haproxy -v | head -n1 | cut -d' ' -f3); nginx: $(nginx -v 2>&1 | sed 's|.*nginx/||')"
	echo "- new connections: wrk -t2 -c$NEWCONN_CONNS -H 'Connection: close'; keep-alive: wrk -t2 -c64;"
	echo "  UDP: 16 flows × 4 datagrams in flight, 64 B; UDP GSO: 8 flows, each sending 16 × 1,200 B as one GSO buffer"
	echo "  once the last 16 came back (the echo answers each datagram alone); idle: $IDLE_CONNS keep-alive connections, one request each${IDLE_NOTE:+ ($IDLE_NOTE)}"
	echo
	echo "$TABLE"
	echo
	cat <<'EOF'
What bounds the figures: client (wrk, iperf3, benchtool), proxy and servers share the same CPUs, and the
machine is shared with other work (see the load average), so every rate is CPU-bound and the
configurations compete with their own load generator. Kernel DNAT and direct costs are softirq time,
which no process is charged for: "proxy CPU per GB" exists only for HAProxy, nginx and
kube-userspace-proxy, and "RSS per idle connection" only for them (the kernel keeps a conntrack entry,
about 0.3 KiB). nginx runs a master and one worker per CPU: its CPU, RSS and descriptors are the sums
over its workers (the master carries no connection). HAProxy has no UDP in mode tcp; nginx stream
relays UDP. iperf3 goes to one backend in every configuration.
EOF
	if [ -n "$COSTS" ]; then
		echo
		echo "## Work per request, per proxy (perf stat over its processes, ${DUR}s each, after the table)"
		echo
		echo "A UDP request is a datagram each way; a new-connection request is a connection accepted,"
		echo "one dialled, one HTTP request and answer, and both closed."
		echo
		echo "$COSTS"
	fi
	if [ -n "$PROFILES" ]; then
		echo
		echo "## CPU profile of kube-userspace-proxy, --data-path $([ "$PROF_CFG" = kupel ] && echo eventloop || echo goroutines) (perf record -g, ${DUR}s, one extra run after the table)"
		echo "$PROFILES"
	fi
} >"$WORK/results.md"
cp "$WORK/results.md" "$OUT"
cp "$RAW" "$RAW_OUT"
cat "$WORK/results.md"
log "results written to $OUT (raw samples: $RAW_OUT)"
