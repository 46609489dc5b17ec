# The two commands of the README: `make demo` and `make test`.
GO ?= go
BIN := bin/kube-userspace-proxy

.PHONY: all build static demo serve test unit deps lint bench soak fuzz clean

all: build

# Go prints nothing while it compiles, and a first build (no module or
# build cache) takes minutes: say so, or `make demo` looks hung.
build:
	@[ -x $(BIN) ] || echo "Compiling $(BIN): the first build takes a few minutes and prints nothing until it is done."
	$(GO) build -o $(BIN) ./cmd/kube-userspace-proxy

# A static binary for container images (the Dockerfile builds the same way):
# no cgo, so no libc to match; -trimpath, so no build paths inside; the
# version given at link time, since an image build has no .git to read.
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
STATIC_OUT ?= bin/static/kube-userspace-proxy

static:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "-s -w -X main.version=$(VERSION)" -o $(STATIC_OUT) ./cmd/kube-userspace-proxy

# No cluster and no root: three local backends, the real proxier, the path
# of one request, the session-affinity and fault experiments as tables.
# The built binary, not `go run`: go run exits 1 on Ctrl-C whatever the
# program it ran said (demo: 130, interrupted; demo --serve: 0, stopped
# cleanly), and make then reports "Error 1".
demo: build
	$(BIN) demo

serve: build
	$(BIN) demo --serve

# Everything: format, vet, unit tests, and (as root) the namespace and
# control-plane suites; then each data path where the first pass did not
# take it: the proxier's tests (whose library default is goroutines) on
# the event loop, the namespace suites (the binary's default is the event
# loop) on goroutines. hack/test-deps.sh installs what is missing.
test: deps lint
	$(GO) test -race -count=1 -timeout 60m ./...
	KUP_TEST_DATA_PATH=eventloop $(GO) test -race -count=1 -timeout 20m ./proxier
	KUP_TEST_DATA_PATH=goroutines $(GO) test -race -count=1 -timeout 20m ./test/e2e

# Unit tests only (fast, no root). The race detector needs a C compiler:
# hack/race-cc.sh says what to install when there is none.
unit: lint
	@GO=$(GO) hack/race-cc.sh
	$(GO) test -race -count=1 -short ./...

deps:
	@GO=$(GO) hack/test-deps.sh

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt needed on:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	@GO=$(GO) hack/staticcheck.sh
	@hack/fuzz_test.sh
	@hack/gocmd_test.sh

bench:
	GO=$(GO) test/bench/run.sh

# 30 minutes of mixed traffic, endpoint churn and vanishing clients through
# the real binary (root); results in test/soak/results. `make test` runs its
# 90-second variant (-soak.duration defaults to 90s).
soak:
	$(GO) test -count=1 -timeout 40m -run TestSoak ./test/soak -soak.duration=30m -soak.results=results -soak.strict -v

# Native Go fuzz targets, each for FUZZTIME, one after another
# (hack/fuzz.sh); a Fuzz function missing from FUZZ_TARGETS fails the run.
# Seed corpora: f.Add in each target and PKG/testdata/fuzz/TARGET. A
# finding is written there and fails the run.
FUZZTIME ?= 60s
FUZZ_TARGETS := \
	FuzzDecodeManifests:./proxier/config \
	FuzzEndpointsConversion:./proxier \
	FuzzConfigFile:./cmd/kube-userspace-proxy \
	FuzzParseSave:./iptables \
	FuzzParseAnnotation:./faults \
	FuzzRequest:./faults/api

fuzz:
	@missing=$$(grep -rhoE '^func Fuzz[A-Za-z0-9_]+' --include='*_test.go' . | sed 's/^func //' | sort -u | \
		while read -r f; do case " $(FUZZ_TARGETS) " in *" $$f:"*) ;; *) echo "$$f" ;; esac; done); \
	if [ -n "$$missing" ]; then echo "FUZZ_TARGETS lacks: $$missing"; exit 1; fi
	GO=$(GO) hack/fuzz.sh $(FUZZTIME) $(FUZZ_TARGETS)

clean:
	rm -rf bin
