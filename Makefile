# stagetune: `make demo` tunes a real schedule on the embedded default (SQLite + local Ray);
# `make test` runs lint, type checks and the whole test suite. Both set everything up first.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# The CPU wheel of torch goes in first so that no dependency pulls a CUDA build. Packages are
# byte-compiled at install: with PYTHONDONTWRITEBYTECODE set, as on some CI machines, every
# process would otherwise compile torch and Ray again (the test suite ran 1.75x slower). pip
# compiles one file at a time, so it installs without compiling and compileall then uses every
# core (on a 2-core machine the installs took 72 s instead of 103; the set-up, 91 s). compileall's
# status is not checked: a few files are written for other Python versions (torch's
# py312_intrinsics.py) and never compile, which pip passes over the same way.
TORCH  := torch==2.13.0

.PHONY: demo test lint typecheck setup clean system-deps

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet --no-compile $(TORCH)
	$(BIN)/pip install --quiet --no-compile -e '.[dev]'
	$(BIN)/python -m compileall -qq -j 0 $(VENV)/lib || true
	touch $(STAMP)

setup: $(STAMP)

# Debian's Chromium drives the dashboard's browser tests (never a downloaded browser), and where
# no Compose is installed Debian's docker-compose (v1, the Compose Debian has) validates
# docker-compose.yml (`config` needs no Docker daemon).
system-deps:
	@missing=""; \
	command -v chromium >/dev/null 2>&1 || missing="$$missing chromium"; \
	{ docker compose version >/dev/null 2>&1 || command -v docker-compose >/dev/null 2>&1; } \
	  || missing="$$missing docker-compose"; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null) \
	      || echo "warning: could not install$$missing; the tests that need them will be skipped"; \
	  else echo "warning: not found:$$missing; the tests that need them will be skipped"; fi; \
	fi

demo: $(STAMP)
	$(BIN)/stagetune demo

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy

# Two pytest processes side by side: the tests that train or run studies (markers ray, slow:
# they may start Ray, in this process or in a subprocess, so they never run beside each other)
# one after another in one, as in a single run (they are sized for the machine's 2 cores and
# share one Ray instance); the type checks, then everything else (quick tests, the browser's
# tests that need no Ray, and the slow tests marked ray_free) in the other, at idle priority
# (SCHED_IDLE: CPU time nothing else wants), since the training run is the longer one and sets
# the time (its 30 slowest tests are listed, the other's 15); the other's report follows when
# both end. Ray runs its worker processes, where the trials train, at nice 15
# (RAY_worker_niceness), so at nice 10 the quick tests came before them, and even at nice 19
# they took about a third of a core from each. Measured on one 2-core machine: the training run
# 12:50 alone, 15:33 beside the quick tests at nice 10, 14:12 at nice 19 (one run each); on
# another, 14:39 alone, 17:51 beside them at nice 19, 16:09 at idle priority (the quick tests
# 12:14 and 13:14). Where chrt cannot set it, nice 19. The quick tests' PyTorch runs one thread
# (OMP_NUM_THREADS=1): at idle priority a second intra-op thread waits, spinning, for a sibling
# the scheduler has put off, and a test that trains 4 epochs of a small model took 151 s instead
# of 1.6 s (the quick tests: 16:53 beside the training run with two threads, 8:49 alone with one).
# The machine is CPU-bound under this layout: the training tests alone use 72 % of 2 cores, the
# quick tests most of the rest. Two training processes side by side (a Ray instance each) were
# measured slower (28.5 min against 23.7 on one VM): the quick tests, starved, ran last, alone.
# Lint runs first.
IDLE := $(shell chrt --idle 0 true 2>/dev/null && echo chrt --idle 0 || echo nice -n 19)
test: $(STAMP) system-deps lint
	@tmp=$$(mktemp -d); \
	( $(IDLE) $(BIN)/mypy; types=$$?; \
	  OMP_NUM_THREADS=1 $(IDLE) $(BIN)/pytest -m "not ray and (not slow or browser or ray_free)" --durations=15 --basetemp="$$tmp/quick"; \
	  tests=$$?; test $$types -eq 0 && test $$tests -eq 0 ) >"$$tmp/quick.log" 2>&1 & \
	quick=$$!; \
	$(BIN)/pytest -m "ray or (slow and not browser and not ray_free)" --durations=30 --basetemp="$$tmp/training"; training=$$?; \
	wait $$quick; quick=$$?; \
	echo "=== the type checks, the quick tests and the browser's (run alongside) ==="; cat "$$tmp/quick.log"; \
	rm -rf "$$tmp"; \
	test $$training -eq 0 && test $$quick -eq 0

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis
