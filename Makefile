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

.PHONY: lambdas
lambdas: ## build functions/<name> into build/lambda/<name>/bootstrap (linux/arm64)
	@set -e; for fn in $(FUNCTIONS); do \
		echo "==> lambda $$fn -> $(LAMBDA_DIR)/$$fn/bootstrap"; \
		GOOS=linux GOARCH=arm64 CGO_ENABLED=0 go build $(LAMBDA_GOFLAGS) -o $(LAMBDA_DIR)/$$fn/bootstrap ./functions/$$fn; \
	done
	@echo "==> lambdas: $(words $(FUNCTIONS)) built"

.PHONY: node_modules
node_modules: ## install the pinned CDK CLI (npm ci) if missing
	@test -x $(CDK) || { echo "==> npm ci"; npm ci --no-audit --no-fund; }

.PHONY: synth
synth: lambdas node_modules ## synthesise the stack for ENV into cdk.out/<ENV>
	@echo "==> synth env=$(ENV) (first run compiles the CDK app: several minutes)"
	@$(CDK) synth --quiet -c env=$(ENV) -o cdk.out/$(ENV)
	@echo "==> template: cdk.out/$(ENV)/capacity-$(ENV).template.json"

.PHONY: test-infra
test-infra: ## CDK assertion tests (first run compiles the CDK app: several minutes)
	@echo "==> test infra"
	cd infra && go test ./...
