#!/usr/bin/env bash
# Which Python `make setup` builds the environment with (issue 26).
#
# TensorFlow 2.21.0 publishes Linux wheels for CPython 3.10, 3.11, 3.12 and 3.13 only (PyPI's
# file list of tensorflow-cpu 2.21.0: cp310-cp313, no cp314), so those are the versions
# accepted (SUPPORTED below; environment.yml and requirements/lock/ follow the same list).
#
#   PYTHON set    that interpreter (a name on PATH or a path), if its version is supported
#   PYTHON unset  the first of python3.13 python3.12 python3.11 python3.10 python3 on PATH that
#                 runs and whose version is supported: the newest the distribution ships
#                 (Debian 13: 3.13, Ubuntu 24.04: 3.12, Debian 12: 3.11, Ubuntu 22.04: 3.10)
#
# Prints one line, NAME<TAB>PATH<TAB>VERSION (e.g. "python3.13	/usr/bin/python3.13	3.13.5"),
# and exits 0. With none supported it prints nothing on stdout, one message on stderr naming
# the accepted versions and the package that brings one on this distribution (os-release:
# Debian 12/13, Ubuntu 22.04/24.04, the RHEL family with dnf), and exits 1. It installs
# nothing and runs only the candidates' `-c` version probe.
# Environment: PYTHON, PYTHON_CANDIDATES (the search list above), OS_RELEASE.
set -uo pipefail
SUPPORTED="3.10 3.11 3.12 3.13"
# shellcheck source=scripts/distro.sh
here=${BASH_SOURCE[0]%/*}; [ "$here" != "${BASH_SOURCE[0]}" ] || here=.   # (no dirname: PATH may be bare)
. "$here/distro.sh"

probe() {   # "3.11.7<TAB>/usr/bin/python3.11" (version, real executable) for a CPython that runs;
            # another implementation's version is prefixed with its name ("pypy 3.10.14")
  "$1" -c 'import sys; v = "%d.%d.%d" % sys.version_info[:3]
impl = sys.implementation.name
print((v if impl == "cpython" else impl + " " + v) + "\t" + sys.executable)' 2>/dev/null
}
supported() { local v=${1%.*}; case " $SUPPORTED " in *" $v "*) return 0 ;; esac; return 1; }

# the package (and the line) that brings a supported Python on this distribution
install_hint() {
  case "$family:$os_id:$os_major" in
    debian:*:12) echo "sudo apt-get install -y python3.11 python3.11-venv|python3.11" ;;
    debian:*:13) echo "sudo apt-get install -y python3.13 python3.13-venv|python3.13" ;;
    ubuntu:*:22) echo "sudo apt-get install -y python3.10 python3.10-venv|python3.10" ;;
    ubuntu:*:24) echo "sudo apt-get install -y python3.12 python3.12-venv|python3.12" ;;
    rhel:fedora:*) echo "sudo dnf install -y python3.13 python3.13-devel|python3.13" ;;
    rhel:*:8|rhel:*:9) echo "sudo dnf install -y python3.12 python3.12-devel|python3.12" ;;
    rhel:*:10) echo "sudo dnf install -y python3 python3-devel|python3" ;;   # its python3 is 3.12
    *) echo "|" ;;
  esac
}

found=()
if [ -n "${PYTHON:-}" ]; then
  candidates=("$PYTHON")
else
  read -r -a candidates <<<"${PYTHON_CANDIDATES:-python3.13 python3.12 python3.11 python3.10 python3}"
fi
for cand in "${candidates[@]}"; do
  command -v "$cand" >/dev/null 2>&1 || { [ -z "${PYTHON:-}" ] || found+=("$cand is not found"); continue; }
  probed=$(probe "$cand") || { found+=("$cand does not run"); continue; }
  version=${probed%%$'\t'*} path=${probed#*$'\t'}
  if [ "${version% *}" = "$version" ] && supported "$version"; then
    printf '%s\t%s\t%s\n' "$cand" "$path" "$version"
    exit 0
  fi
  found+=("$cand is Python $version")
done

accepted="CPython ${SUPPORTED// /, }"; accepted="${accepted%, *} or ${accepted##*, }"
hint=$(install_hint); line=${hint%|*}; name=${hint#*|}
{
  printf '\033[1m[setup]\033[0m '
  if [ -n "${PYTHON:-}" ]; then
    printf 'PYTHON=%s' "${found[0]}"
  else
    list=${candidates[*]}
    printf 'no usable Python among %s on PATH' "${list// /, }"
    if [ "${#found[@]}" -gt 0 ]; then joined=$(IFS=';'; echo "${found[*]}"); printf ' (%s)' "${joined//;/; }"; fi
  fi
  printf '. make setup needs %s, the versions TensorFlow 2.21 has wheels for; nothing was installed.\n' \
    "$accepted"
  if [ -n "$line" ]; then
    printf 'On %s install one with:\n    %s\nthen run: make setup PYTHON=%s\n' "${os_name:-this system}" "$line" "$name"
    [ "$family" != rhel ] || printf '(the RHEL family is expected to work, not tested here: see the README)\n'
  else
    printf 'On %s: install one of those (conda: environment.yml, or pyenv), then run:' "${os_name:-this system}"
    printf ' make setup PYTHON=/path/to/python3.X\n'
  fi
} >&2
exit 1
