# pisync: the two commands of the README live here.
#   make run    runs the daemon on the embedded JetStream
#   make test   installs what the tests need, then at the same time checks formatting and vet,
#               runs every test with -race and the TypeScript client's tests (make ts)

GO ?= go
PKGS := ./...

.PHONY: run build release test deps check unit ts test-bin fuzz

run:
	$(GO) run ./cmd/pisync run

build:
	$(GO) build -o bin/pisync ./cmd/pisync

# Static binaries (no cgo) for each platform, with version, commit and build time
# (pisync version), and their SHA-256 sums, into dist/.
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
COMMIT ?= $(shell git rev-parse HEAD 2>/dev/null)
BUILD_TIME ?= $(shell date -u +%Y-%m-%dT%H:%M:%SZ)
PLATFORMS ?= linux/amd64 linux/arm64 darwin/amd64 darwin/arm64 windows/amd64
release:
	rm -rf dist && mkdir -p dist
	for p in $(PLATFORMS); do \
		os=$${p%/*}; arch=$${p#*/}; ext=; [ $$os = windows ] && ext=.exe; \
		CGO_ENABLED=0 GOOS=$$os GOARCH=$$arch $(GO) build -trimpath \
			-ldflags "-s -w -X main.version=$(VERSION) -X main.commit=$(COMMIT) -X main.buildTime=$(BUILD_TIME)" \
			-o dist/pisync-$(VERSION)-$$os-$$arch$$ext ./cmd/pisync || exit 1; \
	done
	cd dist && sha256sum pisync-* > SHA256SUMS

# After the installs, the checks, the Go tests and the TypeScript client's tests run at the
# same time, each target's output printed whole once it ends (-Otarget): most tests wait on
# child processes, servers and timers, which leaves the two cores of a small machine room
# for the checks' compilation meanwhile.
test: deps
	$(MAKE) --no-print-directory -j3 -Otarget check unit ts

# Everything the test suite needs on a fresh machine.
deps:
	./.ci/install-deps

check:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	$(GO) vet $(PKGS)
	# Cross-compilation: file identity and open flags have unix and windows builds.
	GOOS=windows $(GO) build ./... && GOOS=darwin $(GO) build ./... && GOOS=darwin GOARCH=arm64 $(GO) build ./... && GOOS=windows GOARCH=arm64 $(GO) build ./...

# The binaries that tests start as processes of their own, built once for all of them (not
# once per test process): daemontest and bench take them from PISYNC_BIN and
# NATS_SERVER_BIN, and so does the TypeScript client's harness.
TEST_BIN := $(CURDIR)/bin/test
TEST_BIN_ENV := PISYNC_BIN=$(TEST_BIN)/pisync NATS_SERVER_BIN=$(TEST_BIN)/nats-server
test-bin:
	$(GO) build -o $(TEST_BIN)/pisync ./cmd/pisync
	$(GO) build -o $(TEST_BIN)/nats-server github.com/nats-io/nats-server/v2

# Test binaries run at once: go's default is one a core, but most packages' tests wait on
# servers, processes and timers far more than they compute, so at least 3.
# The same holds inside a package: its parallel tests (cmd/pisync's daemons, outages and
# soaks) run 4 at a time rather than one a core.
TEST_P ?= $(shell n=$$(getconf _NPROCESSORS_ONLN 2>/dev/null || echo 1); [ $$n -gt 3 ] && echo $$n || echo 3)
TEST_PARALLEL ?= $(shell n=$$(getconf _NPROCESSORS_ONLN 2>/dev/null || echo 1); [ $$n -gt 4 ] && echo $$n || echo 4)
unit: test-bin
	$(TEST_BIN_ENV) $(GO) test -race -p $(TEST_P) -parallel $(TEST_PARALLEL) -timeout 20m $(PKGS)

# The TypeScript package @pisync/pi-session-store: compile (tsc) and run its tests
# (node --test) against a real nats-server and `pisync serve`, both built here.
TS_DIR := clients/pi-session-store
ts: test-bin
	@command -v npm >/dev/null || { echo "ts: npm is not installed (.ci/install-deps installs it)"; exit 1; }
	cd $(TS_DIR) && { [ node_modules/.package-lock.json -nt package-lock.json ] || npm ci --no-audit --no-fund --loglevel=error; } && $(TEST_BIN_ENV) npm test

# Every fuzz target by hand, FUZZTIME each (make test runs their seed corpora as tests).
FUZZTIME ?= 1m
fuzz:
	@set -e; grep -rHo --include='*_test.go' '^func Fuzz[A-Za-z0-9_]*' . | grep -v node_modules | \
	sed 's|^\(.*\)/[^/]*:func |\1 |' | sort -u | while read pkg fn; do \
		echo "== $$pkg $$fn"; $(GO) test $$pkg -run '^$$' -fuzz "^$$fn$$" -fuzztime $(FUZZTIME); \
	done

# The long soaks by hand: a 2-minute NATS outage with ~100 MB appended, then 10 minutes of
# injected faults. `make test` runs both with short budgets (30 s, 1 min).
SOAK_OUTAGE ?= 2m
SOAK_CHAOS ?= 10m
.PHONY: soak
soak:
	$(GO) test -race ./cmd/pisync -run '^(TestLongOutageMemoryFlat|TestChaos)$$' -count=1 -timeout 0 -v \
		-args -outage=$(SOAK_OUTAGE) -chaos.for=$(SOAK_CHAOS)

# The seeded torture run by hand: fresh seeds for TORTURE_DURATION (default 60m) against the
# real daemon (built with -race) and a real nats-server; every seed and its outcome is
# appended to TORTURE_RECORD. SEED=… [OPS=…] [EXCLUDE=…] replays one seed (the reproducer a
# failure prints). `make test` runs a fixed-seed short version (TestTorture).
TORTURE_DURATION ?= 60m
TORTURE_RECORD ?= $(CURDIR)/torture-results.txt
TORTURE_FLAGS ?=
SEED ?=
OPS ?=
EXCLUDE ?= known
.PHONY: torture
torture:
	$(GO) test ./torture -run '^TestTorture$$' -count=1 -timeout 0 -v -args \
		-torture.race \
		$(if $(SEED),-torture.seed=$(SEED) -torture.ops=$(OPS),-torture.duration=$(TORTURE_DURATION) -torture.record=$(TORTURE_RECORD)) \
		-torture.exclude=$(EXCLUDE) $(TORTURE_FLAGS)

# The session store's torture run by hand: fresh seeds for STORE_TORTURE_DURATION (default
# 60m) of create/append/fork/delete/open/list by concurrent clients against 2-3 `pisync serve`
# replicas (built with -race) SIGKILLed and restarted, checked at quiet points; SEED=…
# [STORE_OPS=…] replays one seed. `make test` runs one fixed seed (TestStoreTorture).
STORE_TORTURE_DURATION ?= 60m
STORE_OPS ?= 150
.PHONY: store-torture
store-torture:
	$(GO) test ./cmd/pisync -run '^TestStoreTorture$$' -count=1 -timeout 0 -v -args \
		-store-torture.race -store-torture.ops=$(STORE_OPS) \
		$(if $(SEED),-store-torture.seed=$(SEED),-store-torture.duration=$(STORE_TORTURE_DURATION))

# The fleet simulator by hand (bench/fleet, docs/capacity.md): FLEET_N daemons in one
# process against a 3-node R3 cluster; steady state, an outage of the whole cluster of
# FLEET_OUTAGE, then every daemon restarted at once. Idle hosts hold 100 to
# FLEET_MAX_FILES sessions. `make fleet-smoke`: 5 hosts, a short outage (about 30 s).
FLEET_N ?= 200
FLEET_OUTAGE ?= 60s
FLEET_MAX_FILES ?= 5000
.PHONY: fleet fleet-smoke
fleet-smoke:
	PISYNC_FLEET_SMOKE=1 $(GO) test ./bench/fleet -run '^TestFleetSmoke$$' -count=1 -v
fleet:
	PISYNC_FLEET=$(FLEET_N) PISYNC_FLEET_OUTAGE=$(FLEET_OUTAGE) PISYNC_FLEET_MAX_FILES=$(FLEET_MAX_FILES) \
		$(GO) test ./bench/fleet -run '^TestFleet$$' -count=1 -timeout 0 -v

# A rewrite in place during the back-fill, at the size where it was missed (issue 25): 6
# files of 20,000 lines of 1,000 bytes, REWRITE_RUNS times. `make test` runs 2 files of
# 4,000 lines once (TestRewriteDuringBackfill).
REWRITE_RUNS ?= 4
.PHONY: rewrite-soak
rewrite-soak:
	$(GO) test ./cmd/pisync -run '^TestRewriteDuringBackfill$$' -count=$(REWRITE_RUNS) -timeout 0 -v \
		-args -backfill-rewrite.files=6 -backfill-rewrite.lines=20000
