# A fresh clone needs only: `make plan` (renders the dev stack offline) and `make test`.
PYTHON ?= python3
VENV := .venv
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

plan: $(VENV)/.installed  ## render one stack offline (STACK=dev|staging|prod|local) into build/plan/STACK
	$(BIN)/python -m trainyard plan --stack $(STACK) --out build/plan/$(STACK)

plans: $(VENV)/.installed  ## refresh the reviewed plans in plans/ (commit them with the change)
	for s in $(STACKS); do $(BIN)/python -m trainyard plan --stack $$s --quiet --out plans/$$s > /dev/null || exit 1; done

test: $(VENV)/.dev-installed
	$(BIN)/python -m pytest

lint: $(VENV)/.dev-installed
	$(BIN)/ruff check infra workloads tests bench policy
	$(BIN)/mypy infra/trainyard workloads/trainyard_train

bench: $(VENV)/.dev-installed
	for b in bench/*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

clean:
	rm -rf $(VENV) build
