# pisync: the two commands of the README live here.
#   make run    runs the daemon on the embedded JetStream
#   make test   installs what the tests need, checks formatting and vet, runs every test with -race

GO ?= go
PKGS := ./...

.PHONY: run build test deps check unit bench-smoke fuzz-smoke

run:
	$(GO) run ./cmd/pisync run

build:
	$(GO) build -o bin/pisync ./cmd/pisync

test: deps check unit

# Everything the test suite needs on a fresh machine.
deps:
	./.ci/install-deps

check:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	$(GO) vet $(PKGS)

unit:
	$(GO) test -race -timeout 20m $(PKGS)
