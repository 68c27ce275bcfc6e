# goroce: make test runs everything CI runs. Root is needed for the netns, XDP and qemu tests;
# without it those tests skip and say why.
GO        ?= go
FUZZTIME  ?= 10s
# fuzz-ci: every Fuzz target for a few seconds, with one fuzzing worker each.
FUZZCI_TIME     ?= 3s
FUZZCI_PARALLEL ?= 1
TIMEOUT   ?= 60m
# Every package except the qemu interop suite, which runs on its own so that its guests do not
# compete with the rest for the two cores.
UNIT_PKGS  = $$($(GO) list ./... | grep -v /interop)
INTEROP_PKGS = $$($(GO) list ./interop/... 2>/dev/null)
# The unit tests run a second time under the race detector, all but the benchmarks' (whose
# figures the instrumentation would only slow down). -short trims the engine's soak and
# multi-MiB lossy runs: the first run covers them, and instrumented they alone take minutes.
RACE_PKGS  = $$($(GO) list ./... | grep -v -e /interop -e '/bench$$')
RACE       = $(GO) test -race -short -count=1 -timeout $(TIMEOUT) $(RACE_PKGS)
# rstream's and riostream's default series against goroce in both roles: the tools' own sizes and
# counts, 220,000 round trips per run, minutes of one core of an emulated (TCG) guest each, so it
# runs last, alone. A run that hangs ends within minutes (2 minutes without a received frame, or
# its guest's NIC or qemu failing) and is rerun once if its guest failed (interop/README.md);
# SERIES_TIMEOUT is a backstop wide enough for a loaded host.
SERIES     = GOROCE_RSOCKET_SERIES=1 $(GO) test -count=1 -timeout $(SERIES_TIMEOUT) -v -run '^TestDefaultSeries$$' ./interop/rsocket
SERIES_TIMEOUT ?= 80m
# Every package but the Linux-only ones (AF_XDP and eBPF, the qemu lab): they build for darwin
# and windows, netdev and rocectl with the kernel UDP link only. The list is linuxOnly in
# internal/layering/layering_test.go, whose TestBuildsOffLinux runs the same checks under make test.
CROSS_PKGS = $$($(GO) list ./... | grep -v -E '/(xdp|bpf|link/xdplink)$$|/interop(/|$$)')

.PHONY: all build test unit race interop series bench fuzz fuzz-ci lint lint-fast fmt demo clean cross

all: build test

build:
	$(GO) build ./...

## test: build, vet, every unit and netns test, again with -race, then the rxe interop suite and
## the rsocket tools' default series.
test: build
	$(GO) vet ./...
	$(GO) test -count=1 -timeout $(TIMEOUT) $(UNIT_PKGS)
	$(RACE)
	@if [ -n "$(INTEROP_PKGS)" ]; then $(GO) test -count=1 -timeout $(TIMEOUT) -v $(INTEROP_PKGS); fi
	$(SERIES)

unit:
	$(GO) test -count=1 -timeout $(TIMEOUT) $(UNIT_PKGS)

## cross: every package but the Linux-only ones builds for darwin and windows; their tests vet for darwin.
cross:
	GOOS=darwin $(GO) build $(CROSS_PKGS)
	GOOS=windows $(GO) build $(CROSS_PKGS)
	GOOS=darwin $(GO) vet $(CROSS_PKGS)

## race: the unit tests under the race detector.
race:
	$(RACE)

## interop: only the tests against real rdma_rxe peers in qemu guests (the default series aside).
interop:
	$(GO) test -count=1 -timeout $(TIMEOUT) -v $(INTEROP_PKGS)

## series: rstream's and riostream's default series against goroce in both roles, in rdma_rxe guests.
series:
	$(SERIES)

## bench: Go benchmarks of every package, then the side-by-side link table (see bench/README.md).
bench:
	$(GO) test -run '^$$' -bench . -benchmem $(UNIT_PKGS)
	$(GO) test ./bench -run '^TestLinkTable$$' -count=1 -v -args -linkbench.duration=3s

## fuzz: every Fuzz target in the tree for FUZZTIME each.
fuzz:
	@scripts/fuzz-all $(FUZZTIME)

## fuzz-ci: every Fuzz target for FUZZCI_TIME each, each package's test binary compiled once
## (CI runs it before make test, which does not include it; make test runs only the seed corpora).
fuzz-ci:
	@FUZZPARALLEL=$(FUZZCI_PARALLEL) scripts/fuzz-all $(FUZZCI_TIME)

## lint: gofmt, go vet, staticcheck.
lint: lint-fast
	$(GO) run honnef.co/go/tools/cmd/staticcheck@v0.8.2 ./...

## lint-fast: gofmt and go vet only (what CI checks before the tests).
lint-fast:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...

fmt:
	gofmt -w $$(git ls-files '*.go')

clean:
	rm -rf bin
