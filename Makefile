# Two entry points: `make deploy` (pyinfra inventory.py deploy.py) and `make test`.
# Both bootstrap the project's venv first; ARGS passes flags to pyinfra (e.g. ARGS=--dry).
VENV ?= .venv
PYTHON ?= python3
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)
# Without a hosts file (hosts.yml here, or $PVE_SGLANG_HOSTS) the deploy targets the embedded
# default: a local LXC container on this machine (pve_sglang/embedded_hosts.yml).
EMBEDDED_DEFAULT := $(if $(PVE_SGLANG_HOSTS),,$(if $(wildcard hosts.yml),,yes))

# apt-get install of $(1), as root, saying why ($(2)); anything else stops with what to install.
define apt_install
	if [ "$$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then \
	  echo "make: $(2): install $(1) (as root on Debian: apt-get install $(1)), then re-run" >&2; exit 1; fi; \
	echo "make: $(2): installing $(1) from Debian (apt-get, as root)"; \
	apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(1) >/dev/null
endef

.PHONY: deploy deploy-deps tune status test test-fast lint system-deps bench lock bench-stack release bench-tune \
	gpu-kit gpu-kit-check

# The tests' caches (the Debian rootfs, wheels, venvs: GBs, built once) live outside the clone
# as root, so that a fresh clone on this machine finds them (CI's .ci/run uses the same folder).
export PVE_SGLANG_TEST_CACHE ?= $(if $(filter 0,$(shell id -u)),/var/cache/pve-sglang-tests,$(CURDIR)/.cache)
# The suite runs on TEST_WORKERS pytest workers (pytest-xdist), each taking a whole module at a
# time, so that a module's shared container is made once (TEST_WORKERS=0: one process). Four
# on 2 cores: the LXC modules wait on systemd and servers more than they compute (2 workers:
# 15:59, 3: 14:49, one evening; 3: 15:29, 4: 14:20, one sitting, with make tune's LXC test).
TEST_WORKERS ?= 4
# --no-loadscope-reorder: the workers take the modules in the suite's own order (the longest
# first, tests/conftest.py), not xdist's default (the most tests first), which started a
# module of 5 tests and 6 minutes near the end.
workers = $(if $(filter 0,$(TEST_WORKERS)),,-n $(1) --dist loadscope --no-loadscope-reorder)
PYTEST_WORKERS = $(call workers,$(TEST_WORKERS))
# The fast tier waits more than it computes (local servers, the stand-in's pauses): 4 workers on
# 2 cores, 43-53 s in four runs against 51-63 s with 3, side by side in one sitting.
FAST_WORKERS ?= 4

# Debian's python3 has no ensurepip without python3-venv: `python3 -m venv` fails there.
$(STAMP): pyproject.toml
	@$(PYTHON) -m venv $(VENV) >/dev/null 2>&1 || { \
	  $(call apt_install,python3-venv,$(PYTHON) -m venv cannot work here (no ensurepip)); }
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e '.[test,bench]'
	rm -f $(VENV)/.installed-* && touch $@

# The tests boot real LXC containers: lxc, debootstrap and zstd from Debian, as root.
system-deps:
	@command -v lxc-start >/dev/null && command -v debootstrap >/dev/null && command -v zstd >/dev/null \
	  && command -v dnsmasq >/dev/null \
	  || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq lxc debootstrap zstd dnsmasq-base; }

# The embedded default creates its container with lxc-create's debian template (debootstrap).
# With a hosts file nothing is installed here: the targets are other machines.
deploy-deps:
ifeq ($(EMBEDDED_DEFAULT),yes)
	@command -v lxc-start >/dev/null && command -v debootstrap >/dev/null && command -v dnsmasq >/dev/null || { \
	  $(call apt_install,lxc debootstrap dnsmasq-base,no hosts file: the embedded default deploys a local LXC container on lxc-net's bridge); }
endif

# pyinfra asks for Enter before it changes anything; with no terminal to ask on it would end in
# an internal exception (EOFError) after connecting: say what to do instead, before that.
CONFIRMED = $(filter -y --yes --dry,$(ARGS))
deploy: deploy-deps $(STAMP)
	@[ -t 0 ] || [ -n "$(CONFIRMED)" ] || { echo "make deploy: no terminal to confirm the changes on: run it at a terminal, or add ARGS=-y to apply them without asking (ARGS=--dry shows them)" >&2; exit 2; }
	$(VENV)/bin/pyinfra inventory.py deploy.py $(ARGS)

# The tuning search over the server's flags (pyinfra inventory.py tune.py); ARGS=--dry shows
# its plan, ARGS="--limit NAME" picks one container.
tune: deploy-deps $(STAMP)
	$(VENV)/bin/pyinfra inventory.py tune.py $(ARGS)

# One row per GPU container and gateway, read-only (pyinfra inventory.py status.py): JSON=1 prints
# JSON (STATUS_JSON=1 for pyinfra itself), ARGS="--limit NAME" picks hosts. -y: it changes
# nothing, and pyinfra would ask whether to go on when a host cannot be reached.
status: $(STAMP)
	@STATUS_JSON=$(JSON) $(VENV)/bin/pyinfra inventory.py status.py -y $(ARGS)

test: $(STAMP) system-deps
	$(VENV)/bin/python -m pytest $(PYTEST_WORKERS) $(ARGS)

# ruff, mypy and shellcheck at 0 findings (rules: pyproject.toml's [tool.ruff] and [tool.mypy]);
# .ci/run runs it before the tests. The deploy writes no shell file (its units run programs, its
# scripts are Python): shellcheck reads the repository's own shell files.
SHELL_FILES = .ci/run tests/bin/pct tests/fixtures/capture_gpu_host.sh
lint: $(STAMP)
	$(VENV)/bin/ruff check --quiet .
	$(VENV)/bin/mypy
	$(VENV)/bin/shellcheck $(SHELL_FILES)

# The fast tier: every test that boots no container, needs no root and downloads nothing
# (tests/conftest.py marks the others from the fixtures they use). No system packages needed.
test-fast: $(STAMP)
	$(VENV)/bin/python -m pytest $(call workers,$(FAST_WORKERS)) -m "not lxc and not root and not network" $(ARGS)

bench: $(STAMP) system-deps
	$(VENV)/bin/python bench/deploy_cost.py $(ARGS)

# The tuning search beside Optuna and a random search on the simulated landscapes, one run
# (bench/tune_search.py; ARGS="--hours 8,2 --seeds 10"): the table of docs/benchmarks.md.
bench-tune: $(STAMP)
	$(VENV)/bin/python bench/tune_search.py $(ARGS)

# The repository's lock of the default release set (group_data/locks/), made again with uv
# from the pins in group_data/all.py: after a pin changes, or to take newer dependencies.
lock: $(STAMP)
	$(VENV)/bin/python -m pve_sglang.stack.lock refresh

# Move the default release set to sglang VERSION, on proof (devtools/release.py): its lock, its
# wheels, the startup watch's lines and the server flags against its sources, the whole deploy
# into a real LXC container with its real argument parser; any check failing changes nothing.
release: $(STAMP) system-deps
	@test -n "$(VERSION)" || { echo "make release VERSION=X (an sglang release)" >&2; exit 2; }
	$(VENV)/bin/python -m devtools.release advance $(VERSION) $(ARGS)

# The wheel store with the real locked set (about 5 GB of wheels, 10 GB installed): the stack
# step of a first container, a second one on the same host, and the first recreated.
bench-stack: $(STAMP) system-deps
	$(VENV)/bin/python bench/stack_store.py $(ARGS)

# The kit that takes SGLang 0.5.17 to a lent GPU machine (tests/device/gpu_kit.py): the trimmed
# wheel set in parts under one call's carry, the model's config and tokenizer, the device
# scripts, in $(GPU_KIT); gpu-kit-check imports what the start touches with that set first.
# The run itself: tests/device/README.md.
GPU_KIT ?= .devkit
gpu-kit: $(STAMP)
	$(VENV)/bin/python tests/device/gpu_kit.py build --out $(GPU_KIT) $(ARGS)

gpu-kit-check: $(STAMP)
	$(VENV)/bin/python tests/device/gpu_kit.py check $(ARGS)
