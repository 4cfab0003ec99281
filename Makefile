# d1idem: common tasks. `make test` is the whole suite, as CI runs it.
GO ?= go
NPM ?= npm
PKGS := ./...

# The adapters under contrib/ are modules of their own (each with a replace
# of the core to ../..). Every command here runs outside the workspace of
# go.work, as a user's build does: the core with its own go.mod's versions,
# each adapter as a clone of it would build. go.work is for editors and
# commands typed by hand.
export GOWORK := off
CONTRIB := $(patsubst %/go.mod,%,$(wildcard contrib/*/go.mod))
# Runs $(1) in each module of contrib/, all of them even if one fails.
in_contrib = status=0; for m in $(CONTRIB); do echo "$$m: $(1)"; (cd $$m && $(1)) || status=1; done; exit $$status

.PHONY: all build test test-core test-contrib test-short bench bench-budget bench-figures lint demo fuzz conformance-deps clean bridge-statements faults-long faults-long-bridge first-hour-timings

all: lint test

build:
	$(GO) build $(PKGS)
	@$(call in_contrib,$(GO) build ./...)

# The whole suite, under the race detector. The workerd conformance leg needs
# Node and the pinned npm packages in conformance/; they are installed here
# when npm is present. In CI (CI set) a missing Node fails the suite.
# After the tests it says whether the workerd leg ran: each test binary that
# asks for it leaves a word in a marker directory (internal/d1test,
# D1TEST_WORKERD_MARKER); and whether the console's browser tests ran in
# Chromium (console/browser_test.go, D1IDEM_BROWSER_MARKER). Then each
# module of contrib/ is vetted and tested under the race detector too.
test: conformance-deps test-core test-contrib

test-contrib:
	@$(call in_contrib,$(GO) vet ./... && $(GO) test -race -count=1 -timeout 10m ./...)

test-core:
	$(GO) vet $(PKGS)
	@marker=$$(mktemp -d); bmarker=$$(mktemp -d); \
	D1TEST_WORKERD_MARKER=$$marker D1IDEM_BROWSER_MARKER=$$bmarker $(GO) test -race -count=1 -timeout 20m $(PKGS); status=$$?; \
	ran=$$(grep -l '^ran' $$marker/* 2>/dev/null | xargs -r -n1 basename | sed 's/\.test\..*//' | sort -u | paste -sd, - | sed 's/,/, /g'); \
	other=$$(grep -hv '^ran' $$marker/* 2>/dev/null | sort -u | head -n 1); \
	if [ -n "$$ran" ]; then echo "workerd leg: ran, on real workerd D1 (in $$ran)"; \
	elif [ -n "$$other" ]; then echo "workerd leg: NOT run: $$other"; \
	else echo "workerd leg: NOT run: no test asked for it"; fi; \
	browser=$$(cat $$bmarker/* 2>/dev/null | sort -u | head -n 1); \
	if [ "$$browser" = ran ]; then echo "browser leg: ran, the console in headless Chromium"; \
	elif [ -n "$$browser" ]; then echo "browser leg: NOT run: $${browser#skipped: }"; \
	else echo "browser leg: NOT run: no test asked for it"; fi; \
	rm -rf "$$marker" "$$bmarker"; exit $$status

test-short:
	$(GO) test -count=1 -short $(PKGS)
	@$(call in_contrib,$(GO) test -count=1 -short ./...)

conformance-deps:
	@if command -v $(NPM) >/dev/null 2>&1; then \
		if [ ! -d conformance/node_modules/miniflare ] || [ ! -d conformance/node_modules/wrangler ]; then \
			echo "installing pinned Miniflare and wrangler for the workerd and wrangler legs (npm ci)"; \
			cd conformance && $(NPM) ci --no-audit --no-fund --loglevel=error; \
		fi; \
	else \
		echo "npm not found: the workerd conformance leg will skip (it fails in CI)"; \
	fi

# Every benchmark, printed as one table with the machine noted and each
# figure beside its target (about 10 minutes).
# The telemetry overhead runs first, on a quiet machine, with a fixed 10,000
# requests per side (at the default benchtime a single run ranges from 0.2 %
# to 29 %). The raw output is kept in bench.out, for bench-figures.
bench: conformance-deps
	@{ $(GO) test -run '^$$' -bench . -benchtime 200x ./idem/ ./d1local/ && \
	   $(GO) test -run '^$$' -bench ClaimLookup -benchtime 200x ./conformance/ && \
	   $(GO) test -run '^$$' -bench BridgeOverhead -benchtime 2000x ./conformance/ && \
	   $(GO) test -run '^$$' -bench MiddlewareTelemetry -benchtime 10000x ./bench/ && \
	   $(GO) test -run '^$$' -bench PageCalls -benchtime 3x ./console/ && \
	   $(GO) test -run '^$$' -bench . -skip MiddlewareTelemetry -timeout 20m ./bench/ ; } 2>&1 | tee bench.out | $(GO) run ./tools/benchtable

# The long forms of the API-budget benchmarks: open-loop load at
# 20, 150 and 400 first executions per second and four replica processes,
# each run BENCH_DURATION long (600 s, two budget windows: about 45 minutes
# in all). The raw output is kept in bench-budget.out, for bench-figures.
BENCH_DURATION ?= 600s
bench-budget:
	@$(GO) test -run '^$$' -bench '^Benchmark(OpenLoop|Replicas)$$' -timeout 4h ./bench/ \
		-bench.long -bench.duration $(BENCH_DURATION) 2>&1 | tee bench-budget.out | $(GO) run ./tools/benchtable

# The long randomized fault runs: rounds of fresh keys for
# FAULTS_DURATION (10 minutes) on d1local, or on the bridge in workerd. Each
# ends with one SUMMARY line of counts; a violation fails the run.
FAULTS_DURATION ?= 10m
faults-long:
	$(GO) test ./faults -run '^TestRandomizedFaults$$/^long$$' -v -count=1 -timeout 40m -faults.long -faults.duration $(FAULTS_DURATION)

faults-long-bridge: conformance-deps
	$(GO) test ./faults -run '^TestRandomizedFaultsBridge$$/^long$$' -v -count=1 -timeout 40m -faults.long -faults.duration $(FAULTS_DURATION)

# Rewrite the figures table of docs/benchmarks.md (between
# <!-- bench:begin --> and <!-- bench:end -->), and docs/bridge.md's (the
# bridge's rows), from the output of the last make bench, and of the last
# make bench-budget if there is one.
bench-figures:
	@test -f bench.out || { echo "no bench.out: run make bench first"; exit 1; }
	@$(GO) run ./tools/benchtable -doc docs/benchmarks.md -bridge docs/bridge.md bench.out $(wildcard bench-budget.out) >/dev/null

# Regenerate bridge/ledger-statements.js after changing the idem package's
# statements (go test ./idem fails while it is stale).
bridge-statements:
	$(GO) test ./idem -run TestBridgeStatements -update

# staticcheck is pinned in tools/staticcheck/go.mod (a tool directive of its own module,
# so that its dependencies stay out of the product's go.mod and of the
# demo's first build).
STATICCHECK ?= $(GO) tool -modfile=$(CURDIR)/tools/staticcheck/go.mod staticcheck

# vet, gofmt, staticcheck, and the layering and size rules of
# CONTRIBUTING.md (the TestLint tests of deps_test.go).
lint:
	$(GO) vet $(PKGS)
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(STATICCHECK) $(PKGS)
	@$(call in_contrib,$(GO) vet ./... && $(STATICCHECK) ./...)
	$(GO) test -count=1 -run '^TestLint' .

demo:
	$(GO) run ./cmd/d1idem demo

# A newcomer's first hour, timed (about 15 minutes of both cores; run it on
# a quiet machine): on a fresh clone of HEAD with empty Go build and module
# caches, the demo's first line and its end, then make test with a fresh
# npm ci; then both again, warm. The figures, with the date and commit, go
# between the lines <!-- timings:begin --> and <!-- timings:end --> of
# TIMINGS_FILE. tools/first-hour-timings.sh --fake FILE checks the script
# in seconds, with stand-ins for the demo and make test.
TIMINGS_FILE ?= README.md
first-hour-timings:
	tools/first-hour-timings.sh $(TIMINGS_FILE)

# Each fuzz target for FUZZTIME (default 10s). Their seed corpora
# (testdata/fuzz) also run as plain tests in `make test`. Go 1.26's fuzz
# coordinator can end a run at the FUZZTIME boundary with "context deadline
# exceeded" though nothing failed (golang/go#75804, fixed in Go 1.27): a
# target that fails that way without writing a failing input is run once
# more; one that writes an input fails at once.
FUZZTIME ?= 10s
FUZZ_TARGETS := idem:FuzzValidKey idem:FuzzFingerprintInput d1local:FuzzRequestDecoder d1local:FuzzRequestDecoderMatchesReference d1client:FuzzResponseDecoder d1client:FuzzDecoderMatchesReference d1client:FuzzAppendJSONString d1client/budget:FuzzParseRateLimitHeaders d1client:FuzzClassifySQL internal/sqlite:FuzzSplit
fuzz:
	@set -e; for t in $(FUZZ_TARGETS); do \
		pkg=$${t%%:*}; fn=$${t##*:}; \
		echo "fuzz $$pkg $$fn for $(FUZZTIME)"; \
		for try in 1 2; do \
			before=$$(ls ./$$pkg/testdata/fuzz/$$fn 2>/dev/null | wc -l); \
			if $(GO) test -run '^$$' -fuzz "^$$fn$$" -fuzztime $(FUZZTIME) -fuzzminimizetime 1s ./$$pkg/ >fuzz.log 2>&1; \
				then cat fuzz.log; break; fi; \
			cat fuzz.log; \
			after=$$(ls ./$$pkg/testdata/fuzz/$$fn 2>/dev/null | wc -l); \
			if [ $$try = 1 ] && [ $$after = $$before ] && grep -q 'context deadline exceeded' fuzz.log; then \
				echo "fuzz $$pkg $$fn: ended with the fuzz coordinator's deadline race (golang/go#75804), no failing input written; once more"; \
				continue; \
			fi; \
			rm -f fuzz.log; exit 1; \
		done; \
	done; rm -f fuzz.log

clean:
	rm -rf conformance/node_modules
