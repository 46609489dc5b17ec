# kube-userspace-proxy's container image: a static binary on Debian slim with
# iptables. Build from the repository root:
#   docker build -t kube-userspace-proxy:dev --build-arg VERSION=$(git describe --tags --always --dirty) .
# examples/deploy/daemonset.yaml runs this image as /kube-userspace-proxy.

ARG GO_VERSION=1.26

FROM golang:${GO_VERSION}-bookworm AS build
WORKDIR /src
# Modules first, so a source change does not download them again.
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=dev
# The same build as `make static`: no cgo (nothing to match in the runtime
# image's libc), no build paths, the version given at link time.
RUN CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X main.version=${VERSION}" -o /out/kube-userspace-proxy ./cmd/kube-userspace-proxy

# Debian slim, not distroless: the proxy runs iptables-restore, iptables-save
# and their ip6tables twins, which need a shell-free but complete userland
# (xtables modules, libnftnl, libmnl) that distroless does not carry.
# Debian's iptables package has both backends: iptables-nft (the default
# alternative) and iptables-legacy. The rules must go where the node's other
# iptables users (kubelet, the CNI) put theirs: --build-arg IPTABLES_MODE=legacy
# on a node whose `iptables --version` says "(legacy)".
FROM debian:bookworm-slim
ARG IPTABLES_MODE=nft
RUN apt-get update \
 && apt-get install -y --no-install-recommends iptables \
 && rm -rf /var/lib/apt/lists/* \
 && update-alternatives --set iptables /usr/sbin/iptables-${IPTABLES_MODE} \
 && update-alternatives --set ip6tables /usr/sbin/ip6tables-${IPTABLES_MODE}
COPY --from=build /out/kube-userspace-proxy /kube-userspace-proxy
ENTRYPOINT ["/kube-userspace-proxy"]
