# capacity-boundary service. `make help` lists the targets.

SHELL := /bin/bash
.DEFAULT_GOAL := help

ENV ?= local

CDK       := node_modules/.bin/cdk
LAMBDA_DIR := build/lambda
# Every functions/<name>/ with a main.go is a Lambda function.
FUNCTIONS := $(patsubst functions/%/main.go,%,$(wildcard functions/*/main.go))
LAMBDA_GOFLAGS := -tags lambda.norpc -trimpath -ldflags='-s -w'

# Quiet and offline CDK.
export CDK_DISABLE_VERSION_CHECK := 1
export JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION := 20

.PHONY: help
help: ## list the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  %-12s %s\n", $$1, $$2}' $(MAKEFILE_LIST)
	@echo "  variables: ENV=$(ENV) (local|dev|prod...)"

# The web console's libraries: ES module builds of the pinned npm packages, copied from
# node_modules into the folder the api function embeds (never committed; docs/console.md).
CONSOLE_VENDOR := console/web/vendor
CONSOLE_LIBS   := node_modules/preact/dist/preact.mjs node_modules/htm/dist/htm.mjs

.PHONY: console
console: node_modules ## copy the console's pinned libraries (preact, htm) from node_modules into console/web/vendor
	@cp $(CONSOLE_LIBS) $(CONSOLE_VENDOR)/
	@echo "==> console: $(notdir $(CONSOLE_LIBS)) -> $(CONSOLE_VENDOR)"

.PHONY: lambdas
lambdas: console ## build functions/<name> into build/lambda/<name>/bootstrap (linux/arm64, for AWS), a line per step and per function
	@functions/build.sh linux/arm64 $(LAMBDA_DIR) $(LAMBDA_GOFLAGS)

# The local stack runs each function as a host process, built by its runner into
# build/local/<name>/bootstrap with these flags (localstack/stack/build.go), and gives the
# emulator a placeholder for the code: arm64 builds are of no use to it. synth ENV=local builds
# those host bootstraps and points the template's assets at them, and the runner then finds
# them up to date.
LOCAL_BUILD := build/local
LOCAL_GOFLAGS := -tags lambda.norpc

.PHONY: local-functions
local-functions: console ## build functions/<name> for this machine into build/local/<name>/bootstrap (what the local stack runs)
	@functions/build.sh host $(LOCAL_BUILD) $(LOCAL_GOFLAGS)

.PHONY: node_modules
node_modules: ## install the pinned npm packages (CDK CLI, the console's libraries, axe-core) if missing or older than package-lock.json
	@test node_modules/.package-lock.json -nt package-lock.json || { echo "==> npm ci"; npm ci --no-audit --no-fund; }

# What synth needs: a bootstrap per function under the asset root; for ENV=local the host
# builds the local stack runs, for AWS the arm64 ones.
SYNTH_FUNCTIONS = $(if $(filter local,$(ENV)),local-functions,lambdas)
SYNTH_ASSETS    = $(abspath $(if $(filter local,$(ENV)),$(LOCAL_BUILD),$(LAMBDA_DIR)))

.PHONY: synth
synth: $(SYNTH_FUNCTIONS) node_modules ## synthesise the stack for ENV into cdk.out/<ENV>
	@echo "==> CDK app: go build infra/ (a cold Go cache compiles the CDK's Go bindings: minutes)"
	@start=$$SECONDS; go -C infra build -o ../build/cdk-app . && echo "    built in $$((SECONDS - start))s"
	@echo "==> synth env=$(ENV), functions from $(SYNTH_ASSETS)"
	@start=$$SECONDS; $(CDK) synth --quiet -c env=$(ENV) -c assetRoot=$(SYNTH_ASSETS) -o cdk.out/$(ENV) && echo "    synthesised in $$((SECONDS - start))s"
	@echo "==> template: cdk.out/$(ENV)/capacity-$(ENV).template.json"

.PHONY: test-infra
test-infra: ## CDK assertion tests (first run compiles the CDK app: several minutes)
	@echo "==> test infra"
	cd infra && go test ./...

# ---- local stack, tests, benchmarks ----

LOCAL_TEMPLATE := cdk.out/local/capacity-local.template.json
OUTPUTS        := .local/outputs.json
# FUZZ_TARGETS: every fuzz target, as <package>:<target> (go test -fuzz takes one target per
# run); make fuzz runs each for FUZZTIME, make test each for FUZZTIME_SHORT.
FUZZ_TARGETS   := ./shared/httpapi:FuzzDecodeCapacityBody ./functions/api:FuzzAPIBody ./functions/api:FuzzAPIHeaders \
	./functions/api:FuzzAPICursor ./functions/reclaim-events:FuzzReclaimEvent ./shared/agent:FuzzAgentAnswer ./shared/agent:FuzzAgentRequest
FUZZTIME       ?= 2m
FUZZTIME_SHORT ?= 3s

# FAULTS: AWS faults for the functions of the local stack (docs/local-stack.md, "Fault layer"), e.g.
# make run FAULTS='TransactWriteItems:TransactionConflict=0.1,*:Throttling=0.1'
FAULTS ?=
# BENCH_PKGS: every package with a benchmark; make test runs each benchmark once, short.
BENCH_PKGS := $(sort $(patsubst %/,./%,$(dir $(shell grep -rl --include='*_test.go' '^func Benchmark' shared functions cmd localstack))))
# E2E_FAULTS: the AWS faults of the end-to-end runs under faults of make test and make bench:
# 10% transaction conflicts and 10% throttling on every call, 5% of writes applied but
# answered with a timeout and 3% applied but answered 500 InternalServerError (the simulated
# agents also fail 30% of terminate calls).
E2E_FAULTS ?= TransactionConflict=0.1,Throttling=0.1,TransactWriteItems:AmbiguousTimeout=0.05,UpdateItem:AmbiguousTimeout=0.05,PutItem:AmbiguousTimeout=0.05,InternalServerError=0.03

.PHONY: run
run: ## run the whole stack on 127.0.0.1:4566 with demo data (Ctrl-C stops it); FAULTS=... injects AWS faults
	@$(MAKE) --no-print-directory synth ENV=local
	@echo "==> local stack runner and emulator: go build ./localstack/cmd/localstack (a cold Go cache: minutes)"
	@start=$$SECONDS; go build -o build/localstack ./localstack/cmd/localstack && echo "    built in $$((SECONDS - start))s"
	@echo "==> starting the local stack"
	CAPACITY_FAULTS='$(FAULTS)' build/localstack -template $(LOCAL_TEMPLATE) -outputs $(OUTPUTS)

.PHONY: test
test: ## every test: unit, store (fuzz seed corpus included), every fuzz target for FUZZTIME_SHORT, CDK assertions, end to end on the local stack, every benchmark once (short)
	@$(MAKE) --no-print-directory console
	@echo "==> vet"
	go vet ./...
	@echo "==> unit and store tests, with the race detector (the store's run on the in-process emulator; the model-based test short: TestModel)"
	go test -race -count=1 ./console/... ./shared/... ./functions/... ./cmd/... ./docs/...
	@$(MAKE) --no-print-directory fuzz FUZZTIME=$(FUZZTIME_SHORT)
	@$(MAKE) --no-print-directory test-infra
	@$(MAKE) --no-print-directory synth ENV=local
	@echo "==> local stack runner and end-to-end tests through API Gateway on 127.0.0.1:4566"
	go test -count=1 -timeout 15m ./localstack/...
	@echo "==> end-to-end main flows with the stack's functions under AWS faults: $(E2E_FAULTS)"
	E2E_FAULTS='$(E2E_FAULTS)' go test -count=1 -timeout 10m -run UnderFaults ./localstack/e2e
	@echo "==> every benchmark once in its short form (one iteration, small sizes; no figure judged): $(BENCH_PKGS)"
	go test -count=1 -short -timeout 10m -run '^$$' -bench . -benchtime 1x $(BENCH_PKGS)
	E2E_FAULTS='$(E2E_FAULTS)' go test -count=1 -short -timeout 10m -run '^$$' -bench UnderFaults -benchtime 1x ./localstack/e2e

# MODEL_OPS, MODEL_TIME: how many operations the model-based soak runs, and its bound in time;
# MODEL_FAULTS_OPS: how many more it runs under AWS faults.
MODEL_OPS        ?= 100000
MODEL_FAULTS_OPS ?= 20000
MODEL_TIME       ?= 50m

# CHAOS_FAULTS: E2E_FAULTS and 5% of StartExecution calls failing outright; CHAOS_DURATION:
# how long the chaos run drives the stack before it drains and checks.
CHAOS_FAULTS   ?= $(E2E_FAULTS),StartExecution:ExecutionLimitExceeded=0.05
CHAOS_DURATION ?= 5m

.PHONY: soak
soak: ## long runs with the figures of docs/numbers.md "Reliability": the model-based test (MODEL_OPS operations, then MODEL_FAULTS_OPS under AWS faults, each bounded by MODEL_TIME), then chaos on the whole local stack (CHAOS_DURATION), then every fuzz target (FUZZTIME each)
	@echo "==> soak 1/4: model-based test of the domain and the store, $(MODEL_OPS) operations (at most $(MODEL_TIME)) on the in-process emulator"
	MODEL_OPS=$(MODEL_OPS) MODEL_TIME=$(MODEL_TIME) go test -count=1 -timeout 60m -run '^TestModelSoak$$' -v ./shared/capacity
	@echo "==> soak 2/4: the same under AWS faults (transaction conflicts, throttling, lost answers), $(MODEL_FAULTS_OPS) operations (at most $(MODEL_TIME))"
	MODEL_FAULTS=1 MODEL_OPS=$(MODEL_FAULTS_OPS) MODEL_TIME=$(MODEL_TIME) go test -count=1 -timeout 60m -run '^TestModelSoak$$' -v ./shared/capacity
	@$(MAKE) --no-print-directory synth ENV=local
	@echo "==> soak 3/4: chaos, $(CHAOS_DURATION) of concurrent load on the local stack under $(CHAOS_FAULTS), agents failing 30%, bootstraps killed"
	CHAOS_DURATION=$(CHAOS_DURATION) E2E_FAULTS='$(CHAOS_FAULTS)' go test -count=1 -timeout 20m -run '^TestChaos$$' -parallel 16 -v ./localstack/e2e 2>&1 | grep -v '^=== \(RUN\|PAUSE\|CONT\)'; exit $${PIPESTATUS[0]}
	@echo "==> soak 4/4: every fuzz target for $(FUZZTIME) each"
	@$(MAKE) --no-print-directory fuzz
	@echo "==> soak: done"

.PHONY: fuzz
fuzz: ## every fuzz target (FUZZ_TARGETS: request bodies, headers and cursors of every route, the event intake, agent answers and requests) for FUZZTIME each; the instrumented builds take minutes on a cold cache
	@set -e; for t in $(FUZZ_TARGETS); do pkg=$${t%%:*}; name=$${t##*:}; \
		echo "==> fuzz $$name ($$pkg) for $(FUZZTIME)"; \
		go test -count=1 -run '^$$' -fuzz "^$$name\$$" -fuzztime $(FUZZTIME) $$pkg; \
	done

.PHONY: bench
bench: ## latency and size figures (see docs/numbers.md)
	@$(MAKE) --no-print-directory synth ENV=local
	go test -count=1 -run '^$$' -bench 'Reclaim|Bootstrap' -benchtime 200x ./localstack/e2e
	go test -count=1 -run '^$$' -bench 'Termination$$' -benchtime 10x ./localstack/e2e
	@echo "==> eviction notices: reclaim answer to the last notice delivered, 64 VMs over 8 nodes"
	go test -count=1 -timeout 10m -run '^$$' -bench 'Notice$$' -benchtime 3x ./localstack/e2e
	go test -count=1 -run '^$$' -bench ReclaimUnits -benchtime 1x ./shared/capacity
	@echo "==> history: a fresh node against the same node after 1,000 cycles"
	go test -count=1 -timeout 15m -run '^$$' -bench 'History$$' -benchtime 1x ./localstack/e2e
	@echo "==> scale: 1,000-victim fan-out, throughput over 1, 4 and 16 nodes, contention on one node"
	go test -count=1 -timeout 10m -run '^$$' -bench 'Scale$$' -benchtime 1x ./localstack/e2e
	@echo "==> burst: 200 reclaims over 200 nodes within 1 s (typical, grace 120 s, a mix with 64-VM nodes), to the last VM terminated (docs/scale.md)"
	go test -count=1 -timeout 15m -run '^$$' -bench 'Burst$$' -benchtime 1x ./localstack/e2e
	@echo "==> contention: 8 clients on their own units of one node; one writer alone and beside 16 clients"
	go test -count=1 -timeout 15m -run '^$$' -bench 'Contention$$' -benchtime 1x ./localstack/e2e
	@echo "==> web console: a cold load of the node view of a 64-unit node, to its 64 cells drawn, and the bytes it transferred (under 150 KB)"
	go test -count=1 -timeout 10m -run '^$$' -bench 'ConsoleNodeView$$' -benchtime 10x ./localstack/e2e
	@echo "==> 64-VM reclaim over 8 nodes, functions under AWS faults ($(E2E_FAULTS)), agents failing 30% of calls"
	E2E_FAULTS='$(E2E_FAULTS)' go test -count=1 -timeout 20m -run '^$$' -bench TerminationUnderFaults -benchtime 3x ./localstack/e2e

.PHONY: cost
cost: ## measure a typical reclaim's DynamoDB calls (docs/cost/units.json), price it on the prod template into docs/cost.md and set it against the quotas (docs/scale.md, Fleet sizes)
	go test -count=1 -run '^$$' -bench ReclaimUnits -benchtime 1x ./shared/capacity -args -cost-units "$(CURDIR)/docs/cost/units.json"
	cd infra && go test -count=1 -run 'TestCostDoc|TestFleetSizesDoc' . -update

.PHONY: ctl
ctl: ## build the operator CLI into bin/capacityctl (docs/operating.md)
	go build -trimpath -buildvcs=auto -o bin/capacityctl ./cmd/capacityctl

.PHONY: invoke
invoke: ## invoke a function of the running local stack: make invoke FN=api EVENT=events/api-reclaim-dry-run.json
	@test -n "$(EVENT)" || { echo "usage: make invoke FN=api EVENT=events/<file>.json"; exit 2; }
	go run ./localstack/cmd/invoke -fn $(or $(FN),api) -event $(EVENT)

.PHONY: deploy-localstack
deploy-localstack: lambdas node_modules ## deploy to real LocalStack (Docker + LOCALSTACK_AUTH_TOKEN; see docs/local-stack.md)
	@echo "==> cdklocal bootstrap + deploy env=local to LocalStack on localhost:4566"
	node_modules/.bin/cdklocal bootstrap -c env=local
	node_modules/.bin/cdklocal deploy -c env=local --require-approval never --outputs-file $(OUTPUTS)

.PHONY: deploy
deploy: lambdas node_modules ## deploy to AWS: make deploy ENV=dev (uses your AWS credentials)
	$(CDK) deploy -c env=$(ENV) --require-approval broadening --outputs-file cdk.out/outputs-$(ENV).json

.PHONY: clean
clean: ## remove build output
	rm -rf build cdk.out .local
