#!/usr/bin/env bash
# make python-matrix: the project with other Pythons on this machine (issue 26). For each
# version of PYTHON_MATRIX (default "3.10 3.12 3.13"):
#   setup        make setup VENV=.venv-py3XX PYTHON=<that interpreter> KERNEL_USER=0 (a venv of
#                its own; the user-level Jupyter kernel is left alone), hash-locked install and
#                Horovod built (or taken from the wheel cache: its key carries the Python tag)
#   check-build  .venv-py3XX/bin/horovodrun --check-build lists MPI and Gloo as built ([X])
#   unit, tf     make unit, make tf with that venv
#   notebook 00  notebooks/00_environment_check.ipynb under nbval with that venv
# then a table of each step's seconds and PASS/FAIL; exit 1 if any step failed.
# The interpreter for X.Y: PYTHON_X_Y (e.g. PYTHON_3_10=/opt/py/bin/python3.10), else pythonX.Y on
# PATH if it runs, else the newest ~/.pyenv/versions/X.Y.*/bin/pythonX.Y.
# MATRIX_FRESH=1 removes each .venv-py3XX first (a cold setup; the wheel cache is kept).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
say() { printf '\033[1m[python-matrix]\033[0m %s\n' "$*"; }
MATRIX=${PYTHON_MATRIX:-3.10 3.12 3.13}
NB00=notebooks/00_environment_check.ipynb

find_python() {   # X.Y -> an interpreter of that version, or nothing
  local v=$1 var cand
  var="PYTHON_${v//./_}"
  for cand in "${!var:-}" "python$v" $(ls -d "${PYENV_ROOT:-$HOME/.pyenv}"/versions/"$v".*/bin/python"$v" 2>/dev/null | sort -V -r); do
    [ -n "$cand" ] || continue
    if [ "$("$cand" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)" = "$v" ]; then
      command -v "$cand"; return 0
    fi
  done
  return 1
}

ROWS=() failed=0
record() {   # record VERSION STEP SECONDS RESULT
  ROWS+=("$(printf '%-6s %-12s %6s s  %s' "$1" "$2" "$3" "$4")")
  [ "$4" = PASS ] || failed=1
}
run_step() {   # run_step VERSION STEP LOG COMMAND...: times it, records PASS/FAIL
  local v=$1 step=$2 log=$3 t rc=0; shift 3
  say "== Python $v: $step"
  t=$(date +%s)
  "$@" 2>&1 | tee "$log" | grep -E --line-buffered '^\S*\[setup\]|passed|failed|error|Error'   # (as it comes)
  rc=${PIPESTATUS[0]}
  record "$v" "$step" "$(( $(date +%s) - t ))" "$([ "$rc" = 0 ] && echo PASS || echo "FAIL (exit $rc; $log)")"
  return "$rc"
}

LOGS=build/python-matrix
mkdir -p "$LOGS"
t0=$(date +%s)
for v in $MATRIX; do
  py=$(find_python "$v") || { say "no Python $v found (set PYTHON_${v//./_}=/path)"; record "$v" find - "FAIL (no interpreter)"; continue; }
  venv=.venv-py${v//./}
  say "Python $v: $py ($("$py" --version 2>&1)), venv $venv"
  [ "${MATRIX_FRESH:-0}" != 1 ] || rm -rf "$venv"
  run_step "$v" setup "$LOGS/$v-setup.log" \
    make setup VENV="$venv" PYTHON="$py" KERNEL_USER=0 || continue
  run_step "$v" check-build "$LOGS/$v-check-build.log" bash -c '
    out=$("$1"/bin/horovodrun --check-build) || exit 1
    echo "$out"
    controllers=$(echo "$out" | sed -n "/Available Controllers/,/^$/p")
    echo "$controllers" | grep -q "\[X\] MPI" && echo "$controllers" | grep -q "\[X\] Gloo"' _ "$venv"
  run_step "$v" unit "$LOGS/$v-unit.log" make -o setup unit VENV="$venv"
  run_step "$v" tf "$LOGS/$v-tf.log" make -o setup tf VENV="$venv"
  run_step "$v" "notebook 00" "$LOGS/$v-nb00.log" make -o setup notebooks VENV="$venv" NOTEBOOKS="$NB00"
done
say "times (logs in $LOGS/):"
printf '    %s\n' "${ROWS[@]}"
say "total $(( $(date +%s) - t0 )) s"
exit "$failed"
