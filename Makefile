# Two entry points: `make deploy` (pyinfra inventory.py deploy.py) and `make test`.
# Both bootstrap the project's venv first; ARGS passes flags to pyinfra (e.g. ARGS=--dry).
VENV ?= .venv
PYTHON ?= python3
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)

.PHONY: deploy test system-deps bench

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e '.[test,bench]'
	rm -f $(VENV)/.installed-* && touch $@

# The tests boot real LXC containers: lxc, debootstrap and zstd from Debian, as root.
system-deps:
	@command -v lxc-start >/dev/null && command -v debootstrap >/dev/null && command -v zstd >/dev/null \
	  || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq lxc debootstrap zstd; }

deploy: $(STAMP)
	$(VENV)/bin/pyinfra inventory.py deploy.py $(ARGS)

test: $(STAMP) system-deps
	$(VENV)/bin/python -m pytest $(ARGS)

bench: $(STAMP) system-deps
	$(VENV)/bin/python bench/deploy_cost.py $(ARGS)
