# One-command setup: `make demo` and `make test` create the virtualenv and install everything themselves.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install demo test test-soak test-fast lint typecheck bench bench-dynamic bench-env standalone clean

$(STAMP): pyproject.toml clients/python/pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e ./clients/python[cli] -e .[dev]
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/kernelfleet demo

standalone: $(STAMP)
	$(BIN)/kernelfleet standalone

# Compile-bound tests (CUDA codegen and nvcc, the static GPU model, pipeline schedules, Gemmini simulators), the API
# and store tests (each on a database of its own), the models' validation, the SDK-only install, and the end-to-end
# runs whose deadlines are minutes (the daily fleet run, a model onboarded, a plugin kind): nothing in them times a
# kernel against another or holds a deadline of seconds, so they run two at a time on the two cores; every other
# test runs alone (timings, heartbeats and deadlines of seconds).
PARALLEL_TESTS := tests/tuning/gpu tests/tuning/gpu_model tests/tuning/pipeline tests/tuning/gemmini tests/api \
	tests/store tests/models tests/tuning/ukernel/test_gpu_screen.py tests/tuning/ukernel/test_gpu_routes.py \
	tests/bench/test_gpu_model_report.py tests/bench/test_gpu_report.py tests/bench/test_gpu_session.py \
	tests/bench/test_gpu_ukernels.py \
	tests/workers/test_fleet_daily.py tests/workers/test_model_e2e.py tests/workers/test_job_kinds.py \
	tests/clients/test_cli_split.py

test: $(STAMP)
	$(BIN)/ruff check service clients tests bench
	$(BIN)/mypy service clients/python/kernelfleet
	$(BIN)/lint-imports --no-cache
	$(BIN)/pytest -q -n 2 -m "not soak" --durations=15 $(PARALLEL_TESTS)
	$(BIN)/pytest -q -m "not soak" --durations=40 $(foreach d,$(PARALLEL_TESTS),--ignore=$(d))

test-soak: $(STAMP)
	$(BIN)/pytest -q -m soak

test-fast: $(STAMP)
	$(BIN)/pytest -q -m "not slow"

lint: $(STAMP)
	$(BIN)/ruff check service clients tests bench
	$(BIN)/lint-imports --no-cache

typecheck: $(STAMP)
	$(BIN)/mypy service clients/python/kernelfleet

.venv-bench/.installed: bench/requirements.txt pyproject.toml
	$(PY) -m venv .venv-bench
	.venv-bench/bin/pip install --quiet --upgrade pip
	.venv-bench/bin/pip install --quiet -r bench/requirements.txt -e ./clients/python[cli] -e .
	touch .venv-bench/.installed

bench-env: .venv-bench/.installed

bench: .venv-bench/.installed
	.venv-bench/bin/python bench/sketch_vs_vendor.py

bench-dynamic: .venv-bench/.installed
	.venv-bench/bin/python bench/dynamic_bert.py

clean:
	rm -rf $(VENV) .venv-bench .kernelfleet .pytest_cache .mypy_cache .ruff_cache
