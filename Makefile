# d1idem: common tasks. `make test` is the whole suite, as CI runs it.
GO ?= go
NPM ?= npm
PKGS := ./...

.PHONY: all build test test-short bench lint demo fuzz conformance-deps clean

all: lint test

build:
	$(GO) build $(PKGS)

# The whole suite, under the race detector. The workerd conformance leg needs
# Node and the pinned npm packages in conformance/; they are installed here
# when npm is present. In CI (CI set) a missing Node fails the suite.
test: conformance-deps
	$(GO) vet $(PKGS)
	$(GO) test -race -count=1 -timeout 20m $(PKGS)

test-short:
	$(GO) test -count=1 -short $(PKGS)

conformance-deps:
	@if command -v $(NPM) >/dev/null 2>&1; then \
		if [ ! -d conformance/node_modules/miniflare ]; then \
			echo "installing pinned Miniflare for the workerd conformance leg (npm ci)"; \
			cd conformance && $(NPM) ci --no-audit --no-fund --loglevel=error; \
		fi; \
	else \
		echo "npm not found: the workerd conformance leg will skip (it fails in CI)"; \
	fi

# Every benchmark, printed as one table with the machine noted and each
# figure an issue sets a target for beside its target (about 2 minutes).
bench: conformance-deps
	@{ $(GO) test -run '^$$' -bench . -benchtime 200x ./idem/ ./conformance/ ./d1local/ && \
	   $(GO) test -run '^$$' -bench . -timeout 20m ./bench/ ; } 2>&1 | $(GO) run ./internal/benchtable

lint:
	$(GO) vet $(PKGS)
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

demo:
	$(GO) run ./cmd/d1idem demo

# Each fuzz target for FUZZTIME (default 10s). Their seed corpora
# (testdata/fuzz) also run as plain tests in `make test`.
FUZZTIME ?= 10s
FUZZ_TARGETS := idem:FuzzValidKey idem:FuzzFingerprintInput d1local:FuzzRequestDecoder d1client:FuzzResponseDecoder d1client:FuzzDecoderMatchesReference d1client:FuzzAppendJSONString d1client:FuzzParseRateLimitHeaders d1client:FuzzClassifySQL
fuzz:
	@set -e; for t in $(FUZZ_TARGETS); do \
		pkg=$${t%%:*}; fn=$${t##*:}; \
		echo "fuzz $$pkg $$fn for $(FUZZTIME)"; \
		$(GO) test -run '^$$' -fuzz "^$$fn$$" -fuzztime $(FUZZTIME) -fuzzminimizetime 1s ./$$pkg/; \
	done

clean:
	rm -rf conformance/node_modules
