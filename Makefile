# A fresh clone needs only: `make plan` (renders the dev stack offline) and `make test`.
PYTHON ?= python3
VENV := .venv
# Checkov pins protobuf and packaging below what Pulumi needs, so it gets an environment of its own.
CHECKOV_VENV := .venv-checkov
BIN := $(VENV)/bin
STACK ?= dev
STACKS := dev staging prod local

.PHONY: plan plans test lint bench clean

$(VENV)/.installed: requirements.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet -r requirements.txt -e .
	touch $@

$(VENV)/.dev-installed: $(VENV)/.installed requirements-dev.txt workloads/pyproject.toml
	$(BIN)/pip install --quiet -r requirements-dev.txt
	touch $@

$(CHECKOV_VENV)/.installed: requirements-checkov.txt
	$(PYTHON) -m venv $(CHECKOV_VENV)
	$(CHECKOV_VENV)/bin/pip install --quiet -r requirements-checkov.txt
	touch $@

plan: $(VENV)/.installed  ## render one stack offline (STACK=dev|staging|prod|local) into build/plan/STACK, rehearse it
	$(BIN)/python -m trainyard plan --stack $(STACK) --out build/plan/$(STACK) --rehearse

plans: $(VENV)/.installed  ## refresh the reviewed plans in plans/ (commit them with the change)
	for s in $(STACKS); do $(BIN)/python -m trainyard plan --stack $$s --quiet --out plans/$$s > /dev/null || exit 1; done

test: $(VENV)/.dev-installed $(CHECKOV_VENV)/.installed
	CHECKOV=$(CURDIR)/$(CHECKOV_VENV)/bin/checkov $(BIN)/python -m pytest

lint: $(VENV)/.dev-installed
	$(BIN)/ruff check infra workloads tests bench policy
	$(BIN)/mypy infra/trainyard workloads/trainyard_train policy/trainyard_policy bench

bench: $(VENV)/.dev-installed
	for b in bench/*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

clean:
	rm -rf $(VENV) $(CHECKOV_VENV) build
