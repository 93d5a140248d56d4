#!/usr/bin/env bash
# The system packages `make setup` needs (Debian 12/13, Ubuntu 22.04/24.04), as one table:
#
#   what is needed                      how it is checked                          package
#   the interpreter $PYTHON             command -v $PYTHON                         pythonX.Y
#   its venv module with ensurepip      $PYTHON -c 'import ensurepip, venv; ...'   pythonX.Y-venv
#     (only when a venv is to be created: SETUP_NEEDS_VENV=1, the default; X.Y is the version
#      $PYTHON reports, so python3 on Debian 13 needs python3.13-venv)
#   a C++ compiler (Horovod's build)    command -v g++                             g++
#   git (applies patches/ to Horovod)   command -v git                             git
#   the MPI launcher                    command -v mpirun                          openmpi-bin
#   MPI's compiler wrapper and headers  command -v mpicc                           libopenmpi-dev
#   Chromium (browser test; optional)   $CHEXNET_CHROMIUM or command -v chromium   chromium (Debian;
#                                                                   on Ubuntu apt only has a snap shim)
#   Slurm (one-machine Slurm; optional) command -v sbatch slurmctld slurmd         slurm-wlm
#   munge (Slurm's authentication)      command -v munged                          munge
#     (the two Slurm rows only with SETUP_SLURM=1, which setup.sh passes: tests/mpi/test_slurm.py
#      and `make slurm` need them and skip or stop with this install line without them)
#
#   scripts/system_packages.sh               as root: installs what is missing (one apt-get update,
#                                            one apt-get install), then checks every row again and
#                                            names what is still missing; not root: prints the exact
#                                            apt-get line and fails (a missing Chromium only warns)
#   scripts/system_packages.sh --check-only  installs nothing: prints what is missing and the line
#
# Nothing missing: no apt call at all. Exit status 0 when every required row holds, 1 otherwise.
# On the RHEL family (RHEL, its rebuilds, Fedora) it installs nothing and prints the dnf line
# with that family's names (gcc-c++, openmpi-devel, ...; expected to work, not tested here).
# Environment: PYTHON (setup.sh passes the one scripts/python_choice.sh chose; default python3),
# SETUP_NEEDS_VENV (1/0), SETUP_SLURM (1/0, default 0),
# SBIN_DIRS (where daemons are looked for besides PATH, default "/usr/sbin /usr/local/sbin"),
# CHEXNET_CHROMIUM, OS_RELEASE (default /etc/os-release). The checks use only shell builtins and $PYTHON.
set -uo pipefail   # no -e: a failing check is an answer, not an error

PYTHON=${PYTHON:-python3}
case "${1:-}" in
  --check-only) MODE=check ;;
  "") MODE=install ;;
  *) echo "usage: $0 [--check-only]" >&2; exit 2 ;;
esac
say() { printf '\033[1m[setup]\033[0m %s\n' "$*"; }
err() { printf '\033[1m[setup]\033[0m %s\n' "$*" >&2; }

# --- which system: /etc/os-release (family: debian, ubuntu, rhel or other) --------------------
# shellcheck source=scripts/distro.sh
here=${BASH_SOURCE[0]%/*}; [ "$here" != "${BASH_SOURCE[0]}" ] || here=.   # (no dirname: PATH may be bare)
. "$here/distro.sh"
case "$os_id:$os_version" in
  debian:12|debian:13|ubuntu:22.04|ubuntu:24.04) tested=1 ;;
  *) tested=0 ;;
esac

# --- the checks -------------------------------------------------------------------------------
have_cmd() { command -v "$1" >/dev/null 2>&1; }
have_venv() {   # Debian/Ubuntu ship ensurepip (and the wheels it installs) in pythonX.Y-venv
  have_cmd "$PYTHON" && "$PYTHON" -c 'import ensurepip, venv; ensurepip.version()' >/dev/null 2>&1
}
have_daemon() {   # daemons live in sbin, which not every user's PATH has
  local d; have_cmd "$1" && return 0
  for d in ${SBIN_DIRS:-/usr/sbin /usr/local/sbin}; do [ -x "$d/$1" ] && return 0; done; return 1
}
have_slurm() { have_cmd sbatch && have_daemon slurmctld && have_daemon slurmd; }
have_chromium() {
  if [ -n "${CHEXNET_CHROMIUM:-}" ]; then [ -x "$CHEXNET_CHROMIUM" ]; else have_cmd chromium; fi
}

# --- the table: what | how it is checked (shown) | check | package | required/optional --------
WHAT=() HOW=() CHECK=() PKG=() KIND=() NOTE=()
row() { WHAT+=("$1"); HOW+=("$2"); CHECK+=("$3"); PKG+=("$4"); KIND+=("$5"); NOTE+=("${6:-}"); }
# the interpreter's package: pythonX.Y from the version it reports (python3 on Debian 13 is 3.13:
# python3.13-venv), else from its name
py_ver=$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)
[ -n "$py_ver" ] || { py_name=${PYTHON##*/}; [[ $py_name =~ ^python(3\.[0-9]+)$ ]] && py_ver=${BASH_REMATCH[1]}; }
py_pkg=${py_ver:+python$py_ver}
pkg() {   # the package bringing $1 (named as on Debian) on this family; empty: none
  case "$family:$1" in
    rhel:g++) echo gcc-c++ ;;
    rhel:openmpi-bin) echo openmpi ;;
    rhel:libopenmpi-dev) echo openmpi-devel ;;
    rhel:python3.*-venv) echo "${1%-venv}" ;;          # venv and ensurepip are in pythonX.Y
    rhel:slurm-wlm) echo "slurm slurm-slurmctld slurm-slurmd" ;;
    ubuntu:chromium|other:chromium) ;;                 # Ubuntu's is a snap shim (below)
    *) echo "$1" ;;
  esac
}
row "$PYTHON" "command -v $PYTHON" "have_cmd $PYTHON" "$py_pkg" required
if [ "${SETUP_NEEDS_VENV:-1}" = 1 ]; then
  row "the venv module of $PYTHON" "$PYTHON -c 'import ensurepip, venv'" have_venv \
    "$(pkg "${py_pkg:+$py_pkg-venv}")" required
fi
row "g++" "command -v g++" "have_cmd g++" "$(pkg g++)" required
row "git" "command -v git" "have_cmd git" git required
row "mpirun" "command -v mpirun" "have_cmd mpirun" "$(pkg openmpi-bin)" required
row "mpicc" "command -v mpicc" "have_cmd mpicc" "$(pkg libopenmpi-dev)" required
row "Chromium" "${CHEXNET_CHROMIUM:+test -x $CHEXNET_CHROMIUM}${CHEXNET_CHROMIUM:-command -v chromium}" \
  have_chromium "$(pkg chromium)" optional chromium
if [ "${SETUP_SLURM:-0}" = 1 ]; then
  row "Slurm (sbatch, slurmctld, slurmd)" "command -v sbatch slurmctld slurmd" have_slurm \
    "$(pkg slurm-wlm)" optional slurm
  row "munged" "command -v munged" "have_daemon munged" munge optional slurm
fi

# rows that fail now: indices into the table
missing_rows() { local i; for i in "${!WHAT[@]}"; do ${CHECK[$i]} || echo "$i"; done; }
describe() {   # "g++ (package g++) is missing: `command -v g++` fails"
  local i=$1 pkg=${PKG[$1]:-}
  printf '%s (package %s) is missing: `%s` fails' "${WHAT[$i]}" "${pkg:-none on $family}" "${HOW[$i]}"
}
apt_line() { echo "sudo apt-get update && sudo apt-get install -y $*"; }
chromium_note() {
  if [ "$family" = ubuntu ]; then
    echo "on Ubuntu the apt package (chromium-browser) only installs a snap shim, so setup does not" \
         "install it; install Chromium yourself and set CHEXNET_CHROMIUM=/path/to/chromium, or" \
         "tests/notebooks/test_browser.py cannot run"
  else
    echo "tests/notebooks/test_browser.py is skipped without it (not root)"
  fi
}
optional_note() {   # why an optional row matters: $1 = the row's NOTE
  case "$1" in
    chromium) chromium_note ;;
    slurm) echo "the one-machine Slurm (tests/mpi/test_slurm.py, make slurm) needs it; its tests" \
                "are skipped without it" ;;
    *) echo "only some tests need it" ;;
  esac
}

mapfile -t missing < <(missing_rows)
if [ "${#missing[@]}" = 0 ]; then
  say "system packages present: ${PKG[*]}"
  exit 0
fi

req_pkgs=() opt_pkgs=() req_missing=0 unpackaged=0
for i in "${missing[@]}"; do
  if [ "${KIND[$i]}" = required ]; then
    req_missing=1
    if [ -n "${PKG[$i]}" ]; then req_pkgs+=("${PKG[$i]}"); else unpackaged=1; fi
  elif [ -n "${PKG[$i]}" ]; then
    opt_pkgs+=("${PKG[$i]}")
  fi
done
report() {   # what is missing, and the line that installs it
  local i
  for i in "${missing[@]}"; do
    if [ "${KIND[$i]}" = required ]; then err "$(describe "$i")"
    else err "$(describe "$i") (optional: $(optional_note "${NOTE[$i]}"))"; fi
  done
  if [ "$family" = rhel ]; then
    err "this is not Debian or Ubuntu (${os_name:-RHEL family}): setup installs nothing here." \
        "On the RHEL family (expected to work, not tested here) run as root or with sudo:"
    err "    sudo dnf install -y ${req_pkgs[*]} ${opt_pkgs[*]}"
    err "  (chromium, slurm and munge come from EPEL: sudo dnf install -y epel-release; Open MPI's" \
        "mpirun and mpicc are put on PATH by: module load mpi/openmpi-\$(uname -m)), then make setup again"
  elif [ "$family" = other ]; then
    err "this is not Debian or Ubuntu (${os_name:-no ${OS_RELEASE:-/etc/os-release}}): install the" \
        "equivalents of the packages above yourself, or use conda (environment.yml), then make setup again"
  elif [ "${#req_pkgs[@]}" -gt 0 ] || [ "${#opt_pkgs[@]}" -gt 0 ]; then
    err "to install them (${os_name:-$family}), run as root or with sudo:"
    err "    $(apt_line "${req_pkgs[@]}" "${opt_pkgs[@]}")"
  fi
  if [ "$unpackaged" = 1 ]; then
    err "PYTHON=$PYTHON is not a pythonX.Y name from apt: install it and its venv module yourself"
  fi
}

can_install=1
{ [ "$family" = debian ] || [ "$family" = ubuntu ]; } && [ "$(id -u 2>/dev/null)" = 0 ] && have_cmd apt-get || can_install=0
all_pkgs=("${req_pkgs[@]}" "${opt_pkgs[@]}")
[ "${#all_pkgs[@]}" -gt 0 ] || can_install=0   # nothing apt could bring (Chromium on Ubuntu)
if [ "$MODE" = check ] || [ "$can_install" = 0 ]; then
  report
  if [ "$MODE" = install ] && [ "$req_missing" = 1 ]; then
    if [ "$family" = other ] || [ "$family" = rhel ]; then why="this is not Debian or Ubuntu"
    elif [ "$(id -u 2>/dev/null)" != 0 ]; then why="this is not root"
    else why="apt-get cannot provide it"; fi
    err "not installing ($why): install the packages above (or use conda: environment.yml)," \
        "then make setup again"
  fi
  exit "$req_missing"
fi

# --- root on Debian/Ubuntu: one update, the required packages, then the optional ones --------
[ "$tested" = 1 ] || say "note: made for Debian 12/13 and Ubuntu 22.04/24.04, this is ${os_name:-unknown}"
export DEBIAN_FRONTEND=noninteractive
say "installing system packages with apt-get: ${all_pkgs[*]}"
apt-get update -qq || err "apt-get update failed (the install below may still work from cached lists)"
if [ "${#req_pkgs[@]}" -gt 0 ]; then
  apt-get install -y -qq "${req_pkgs[@]}" >/dev/null || err "apt-get install ${req_pkgs[*]} failed"
fi
if [ "${#opt_pkgs[@]}" -gt 0 ]; then
  apt-get install -y -qq "${opt_pkgs[@]}" >/dev/null ||
    err "apt-get install ${opt_pkgs[*]} failed (optional: the tests that need them are skipped)"
fi
hash -r
# the same table again: whatever is still missing is named with its package
mapfile -t missing < <(missing_rows)
status=0
for i in "${missing[@]}"; do
  if [ "${KIND[$i]}" = required ]; then
    err "$(describe "$i") after apt-get install"
    [ "$i" != 0 ] || [ "$family" != ubuntu ] ||
      err "  ($PYTHON is not in every Ubuntu release's archive: use the deadsnakes PPA or conda)"
    status=1
  else
    err "$(describe "$i") (optional: $(optional_note "${NOTE[$i]}"))"
  fi
done
[ "$status" = 0 ] && say "system packages installed: ${all_pkgs[*]}"
exit "$status"
