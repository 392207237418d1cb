#!/usr/bin/env bash
# The extended checks, after the README's test command: the tests marked slow (SmolLM2's
# calibration, long recall and quality runs, fuzzing), then scripts/native_checks.sh
# (sanitizers, NEON under qemu, the CUDA compile and emulator side by side). What needs a
# system package skips and says which where it is missing (scripts/system_packages.sh
# installs them). .ci/run runs the test command, then this.
#
#   bash scripts/extended_checks.sh            # after the README's test command (.venv)
set -uo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
.venv/bin/pytest tests -m slow
tests=$?
bash scripts/native_checks.sh
native=$?
echo "extended_checks: pytest -m slow exited $tests, native_checks.sh $native, in $(( $(date +%s) - start )) s"
[ "$tests" -eq 0 ] && [ "$native" -eq 0 ]
