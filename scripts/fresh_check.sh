#!/usr/bin/env bash
# make fresh-check: the README's commands on a bare Debian, as a new user meets them.
# SUITE=bookworm (default: Debian 12, its python3 is 3.11) or SUITE=trixie (Debian 13, python3
# 3.13 and no python3.11 package; Open MPI 5); CI runs both (issue 26).
#
#   1. debootstrap     a minimal Debian root (debootstrap --variant=minbase $SUITE) in a
#                      new temporary folder under /var/tmp (never inside the repository)
#   2. base packages   this machine's package-index configuration and trust store copied in
#                      (apt sources and apt.conf.d, pip's configuration files and the local
#                      package folders they name, resolv.conf, the local CA certificates), then
#                      ONLY `python3 make git ca-certificates` installed in it
#   3. clone           this repository's HEAD commit, cloned by git inside the root (from the
#                      repository's git folder, shared read-only: a worktree's too)
#   4. make setup      inside the root, as root, with a curated environment (env -i)
#   5. notebook 00     `make notebooks NOTEBOOKS=notebooks/00_environment_check.ipynb` (nbval)
#   6. cleanup         every process running in the root stopped, every mount under it
#                      unmounted (deepest first), the folder removed, also when a step fails or
#                      the run is interrupted; the folder is removed only once nothing is
#                      mounted under it any more (otherwise it refuses and fails)
# Each step's time and the total are printed; the exit status is non-zero if any step fails.
#
# Needs root (debootstrap, chroot, mounts); installs debootstrap with apt-get if missing.
# Only committed work is checked: the root clones HEAD. Environment:
#   FRESH_NO_CACHE=1  share nothing into the root: Horovod is built there (several minutes).
#                     Default: this machine's Horovod wheel cache,
#                     ${CHEXNET_CACHE:-~/.cache/chexnet-at-scale}/wheels, is bind-mounted into
#                     the root's (read-write, so a wheel built there is kept). pip's own
#                     download cache is never shared.
#   FRESH_KEEP=1      keep the root folder for debugging (its processes are still stopped and
#                     everything unmounted); the path is printed; remove it with rm -rf.
#   FRESH_MIRROR      Debian mirror for debootstrap (default: the one in this machine's apt
#                     sources, else http://deb.debian.org/debian)
#   FRESH_TMPDIR      where the temporary folder is made (default /var/tmp)
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd -P)
SUITE=${SUITE:-bookworm}
case "$SUITE" in
  bookworm) RELEASE="Debian 12 (bookworm)" ;;
  trixie) RELEASE="Debian 13 (trixie)" ;;
  *) printf '[fresh-check] ERROR: SUITE must be bookworm (Debian 12) or trixie (Debian 13), not %s\n' "$SUITE" >&2
     exit 2 ;;
esac
T0=$(date +%s)
say() { printf '\033[1m[fresh-check]\033[0m %s\n' "$*"; }
die() { printf '\033[1m[fresh-check]\033[0m ERROR: %s\n' "$*" >&2; exit 1; }

# The script's own stdout and stderr, for the traps: a signal can arrive while a step's output
# is redirected (run ... >log), and the cleanup's report must not go there.
exec 8>&1 9>&2
WORK="" ROOT="" CHILD="" STEP="" STEP_T0=0 FAILED="" SHA=""
STEP_NAMES=() STEP_SECS=()

# --- steps, children, cleanup ------------------------------------------------------------------
step() { end_step; STEP=$1; STEP_T0=$(date +%s); say "== $STEP"; }
end_step() {
  [ -n "$STEP" ] || return 0
  local s=$(( $(date +%s) - STEP_T0 ))
  STEP_NAMES+=("$STEP"); STEP_SECS+=("$s")
  say "-- $STEP: $s s"
  STEP=""
}
# A step's command runs as its own process group in the background, so that a signal to this
# script is handled at once (bash defers traps until a foreground child ends) and cleanup can
# stop the whole group.
run() {
  setsid "$@" </dev/null 8>&- 9>&- &
  CHILD=$!
  local rc=0
  wait "$CHILD" || rc=$?
  CHILD=""
  return "$rc"
}
mounts_under() {   # mount points at or below $WORK, from this process's mount table
  local mp
  [ -n "$WORK" ] || return 0
  while read -r _ _ _ _ mp _; do
    mp=${mp//\\040/ }; mp=${mp//\\011/$'\t'}; mp=${mp//\\012/$'\n'}; mp=${mp//\\134/\\}
    case "$mp" in "$WORK"|"$WORK"/*) printf '%s\n' "$mp" ;; esac
  done < /proc/self/mountinfo
}
rooted_pids() {    # processes whose root directory is the chroot or below it
  local d r
  [ -n "$ROOT" ] || return 0
  for d in /proc/[0-9]*; do
    r=$(readlink "$d/root" 2>/dev/null) || continue
    case "$r" in "$ROOT"|"$ROOT"/*) [ "${d#/proc/}" = $$ ] || echo "${d#/proc/}" ;; esac
  done
}
group_alive() {    # a live (not zombie) process in process group $1
  local d s state _ppid pgrp
  for d in /proc/[0-9]*; do
    s=$(cat "$d/stat" 2>/dev/null) || continue
    read -r state _ppid pgrp _ <<<"${s##*) }"
    [ "$pgrp" = "$1" ] && [ "$state" != Z ] && return 0
  done
  return 1
}
stop_processes() {  # the running step's process group, then anything whose root is the chroot
  local pids i
  if [ -n "$CHILD" ]; then
    say "stopping the running step (process group $CHILD)"
    kill -TERM -- "-$CHILD" 2>/dev/null || true
  fi
  mapfile -t pids < <(rooted_pids)
  if [ "${#pids[@]}" -gt 0 ]; then
    say "stopping ${#pids[@]} process(es) still running in the root: ${pids[*]}"
    kill -TERM "${pids[@]}" 2>/dev/null || true
  fi
  for i in $(seq 1 20); do
    mapfile -t pids < <(rooted_pids)
    { [ -n "$CHILD" ] && group_alive "$CHILD"; } || [ "${#pids[@]}" -gt 0 ] || break
    sleep 0.5
  done
  if [ -n "$CHILD" ] && group_alive "$CHILD"; then kill -KILL -- "-$CHILD" 2>/dev/null || true; fi
  mapfile -t pids < <(rooted_pids)
  if [ "${#pids[@]}" -gt 0 ]; then
    say "killing ${#pids[@]} process(es) that ignored SIGTERM: ${pids[*]}"
    kill -KILL "${pids[@]}" 2>/dev/null || true
    sleep 1
  fi
}
unmount_all() {    # deepest first (a path sorts after its parent), lazily if busy; a few rounds
  local round mp mps
  for round in 1 2 3 4; do
    mapfile -t mps < <(mounts_under | LC_ALL=C sort -r)
    [ "${#mps[@]}" -gt 0 ] || return 0
    for mp in "${mps[@]}"; do
      umount "$mp" 2>/dev/null || umount -l "$mp" 2>/dev/null || say "could not unmount $mp"
    done
  done
}
cleanup() {
  local rc=$? left i total
  set +e                 # clean up as far as possible, whatever fails on the way
  trap '' INT TERM HUP   # a second Ctrl-C must not interrupt the cleanup
  exec 1>&8 2>&9
  if [ -n "$STEP" ]; then FAILED=$STEP; [ "$rc" != 0 ] || rc=1; end_step; fi
  if [ -n "$WORK" ]; then
    step "cleanup"
    stop_processes
    unmount_all
    left=$(mounts_under)
    if [ -n "$left" ]; then
      say "REFUSING to remove $WORK: still mounted under it:"
      printf '%s\n' "$left" | sed 's/^/    /' >&2
      rc=1
    elif [ "${FRESH_KEEP:-0}" = 1 ]; then
      say "FRESH_KEEP=1: kept $WORK (nothing is mounted in it; remove it with rm -rf $WORK)"
    else
      rm -rf --one-file-system -- "$WORK"
      [ ! -e "$WORK" ] || { say "could not remove $WORK"; rc=1; }
    fi
    end_step
  fi
  total=$(( $(date +%s) - T0 ))
  say "times:"
  for i in "${!STEP_NAMES[@]}"; do
    printf '    %-14s %5d s\n' "${STEP_NAMES[$i]}" "${STEP_SECS[$i]}"
  done
  printf '    %-14s %5d s (%d min %d s)\n' total "$total" $(( total / 60 )) $(( total % 60 ))
  if [ "$rc" = 0 ]; then
    say "PASSED: make setup and notebook 00 on a bare $RELEASE (commit ${SHA:0:12})"
  else
    say "FAILED${FAILED:+ in step '$FAILED'} (exit $rc)"
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exec 1>&8 2>&9; say "interrupted"; exit 130' INT
trap 'exec 1>&8 2>&9; say "terminated"; exit 143' TERM
trap 'exec 1>&8 2>&9; say "hung up"; exit 129' HUP

# --- preconditions -------------------------------------------------------------------------------
[ "$(id -u)" = 0 ] || die "needs root (debootstrap, chroot and mounts)"
SHA=$(git -C "$REPO" rev-parse HEAD)
# the git folder holding the objects: REPO/.git, or for a worktree the main checkout's .git
GIT_DIR_SRC=$(cd "$REPO" && cd "$(git rev-parse --git-common-dir)" && pwd -P)
if [ -n "$(git -C "$REPO" status --porcelain --untracked-files=no)" ]; then
  say "note: uncommitted changes in $REPO are not checked: the root clones HEAD"
fi
CACHE_DIR=${CHEXNET_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/chexnet-at-scale}/wheels
host_id=$(. /etc/os-release 2>/dev/null && echo "${ID:-}:${VERSION_CODENAME:-}")

# the Debian mirror: FRESH_MIRROR, else the host's apt sources (deb822 or one-line), else the default
host_mirror() {
  local f
  for f in /etc/apt/sources.list.d/*.sources; do
    [ -f "$f" ] || continue
    awk -v suite="$SUITE" '
      function flush() {
        if (uris != "" && types ~ /(^| )deb( |$)/ && (" " suites " ") ~ (" " suite " ") &&
            (" " comps " ") ~ / main / && tolower(enabled) != "no") { split(uris, u, " "); print u[1]; exit 0 }
        uris = ""; types = ""; suites = ""; comps = ""; enabled = ""
      }
      /^[ \t]*#/ { next }
      /^[ \t]*$/ { flush(); next }
      { key = tolower($1); $1 = ""; sub(/^ +/, "") }
      key == "types:" { types = $0 } key == "uris:" { uris = $0 } key == "suites:" { suites = $0 }
      key == "components:" { comps = $0 } key == "enabled:" { enabled = $0 }
      END { flush() }' "$f" | head -n1
  done
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [ -f "$f" ] || continue
    awk -v suite="$SUITE" '$1 == "deb" {
      i = 2; if ($2 ~ /^\[/) { while (i <= NF && $i !~ /\]$/) i++; i++ }
      if ($(i + 1) == suite) { print $i; exit 0 } }' "$f"
  done
}
MIRROR=${FRESH_MIRROR:-$(host_mirror | head -n1)}
MIRROR=${MIRROR:-http://deb.debian.org/debian}

# --- 1. debootstrap -------------------------------------------------------------------------------
step "debootstrap"
host_pkgs=()
command -v debootstrap >/dev/null 2>&1 || host_pkgs+=(debootstrap)
[ -f /usr/share/keyrings/debian-archive-keyring.gpg ] || host_pkgs+=(debian-archive-keyring)
if [ "${#host_pkgs[@]}" -gt 0 ]; then
  say "installing on this machine: ${host_pkgs[*]}"
  run env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  run env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${host_pkgs[@]}" >/dev/null
fi
mkdir -p "${FRESH_TMPDIR:-/var/tmp}"
WORK=$(mktemp -d "${FRESH_TMPDIR:-/var/tmp}/chexnet-fresh.XXXXXX")
WORK=$(cd "$WORK" && pwd -P)
ROOT=$WORK/root
case "$WORK/" in "$REPO"/*|"$CACHE_DIR"/*) die "the temporary folder $WORK is inside $REPO or the cache" ;; esac
say "root: $ROOT (Debian $SUITE, minbase, from $MIRROR); checking commit $SHA"
if ! run debootstrap --variant=minbase "$SUITE" "$ROOT" "$MIRROR" >"$WORK/debootstrap.log" 2>&1; then
  tail -n 30 "$WORK/debootstrap.log" >&2
  die "debootstrap failed (last lines above)"
fi

# --- 2. base packages -----------------------------------------------------------------------------
step "base packages"
inside() { case "$(realpath -m "$1")/" in "$ROOT"/*) ;; *) die "$1 resolves outside the root" ;; esac; }
bind() {   # bind SRC DST [ro]: DST inside the root, never propagating back to the host
  inside "$2"; mkdir -p "$2"
  mount --bind "$1" "$2"
  mount --make-rslave "$2"
  if [ "${3:-}" = ro ]; then mount -o remount,bind,ro "$2"; fi
}
copy_in() {   # copy_in SRC PATH: a file or a folder, to PATH in the root
  mkdir -p "$(dirname "$ROOT$2")"; inside "$(dirname "$ROOT$2")"
  if [ -d "$1" ]; then
    mkdir -p "$ROOT$2"; inside "$ROOT$2"; cp -aL "$1"/. "$ROOT$2"/
  else
    rm -f "$ROOT$2"; cp -L "$1" "$ROOT$2"
  fi
}
mount -t proc proc "$ROOT/proc"
mount -t sysfs sysfs "$ROOT/sys" 2>/dev/null || { mount --rbind /sys "$ROOT/sys"; mount --make-rslave "$ROOT/sys"; }
bind /dev "$ROOT/dev"
bind /dev/pts "$ROOT/dev/pts"
mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs "$ROOT/dev/shm"   # Open MPI's shared memory

# apt: the host's enabled sources (when the host is the same Debian release) and keyrings, apt.conf.d
if [ "$host_id" = "debian:$SUITE" ]; then
  rm -f "$ROOT/etc/apt/sources.list"
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
    [ -f "$f" ] && copy_in "$f" "$f"
  done
  for f in $(sed -n 's/^[[:space:]]*Signed-By:[[:space:]]*//Ip; s/.*signed-by=\([^] ]*\).*/\1/p' \
               "$ROOT"/etc/apt/sources.list.d/* "$ROOT"/etc/apt/sources.list 2>/dev/null | sort -u); do
    [ -f "$f" ] && [ ! -e "$ROOT$f" ] && copy_in "$f" "$f"
  done
  for d in /etc/apt/trusted.gpg.d /etc/apt/keyrings; do [ -d "$d" ] && copy_in "$d" "$d"; done
else
  say "this machine is not Debian $SUITE ($host_id): the root keeps debootstrap's sources.list"
fi
[ -d /etc/apt/apt.conf.d ] && copy_in /etc/apt/apt.conf.d /etc/apt/apt.conf.d
copy_in /etc/resolv.conf /etc/resolv.conf
[ -f /etc/hosts ] && copy_in /etc/hosts /etc/hosts
printf '#!/bin/sh\nexit 101\n' > "$ROOT/usr/sbin/policy-rc.d"; chmod +x "$ROOT/usr/sbin/policy-rc.d"
# local CA certificates first, so that ca-certificates' update-ca-certificates takes them in
if [ -d /usr/local/share/ca-certificates ]; then
  copy_in /usr/local/share/ca-certificates /usr/local/share/ca-certificates
fi

# the environment of every command in the root: a login's basics plus the host's registry,
# trust-store and proxy settings
ROOT_ENV=(PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root USER=root
          LOGNAME=root LANG=C.UTF-8 "TERM=${TERM:-dumb}")
while read -r var; do
  case "$var" in
    PIP_*|SSL_CERT_*|REQUESTS_CA_BUNDLE|CURL_CA_BUNDLE|GIT_SSL_CAINFO|*proxy*|*PROXY*|CI)
      ROOT_ENV+=("$var=${!var}") ;;
  esac
done < <(compgen -e)
CHROOT=$(command -v chroot)
in_root() { run env -i "${ROOT_ENV[@]}" "$CHROOT" "$ROOT" "$@"; }

in_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq
in_root env DEBIAN_FRONTEND=noninteractive \
  apt-get install -y -qq --no-install-recommends python3 make git ca-certificates >/dev/null
# every local CA must be in the root's bundle (pip, git and curl read it)
bundle=$ROOT/etc/ssl/certs/ca-certificates.crt
for crt in $(find /usr/local/share/ca-certificates -name '*.crt' 2>/dev/null); do
  line=$(sed -n '2p' "$crt")
  if [ -n "$line" ] && ! grep -qF -- "$line" "$bundle" 2>/dev/null; then
    say "note: $crt is not in the root's CA bundle; copying this machine's bundle"
    cp -L /etc/ssl/certs/ca-certificates.crt "$bundle"
    break
  fi
done

# pip: the host's configuration files, and the local folders and files they (or PIP_*) name
pip_confs=()
for f in /etc/pip.conf /etc/xdg/pip "$HOME/.config/pip/pip.conf" "$HOME/.pip/pip.conf" "${PIP_CONFIG_FILE:-}"; do
  [ -n "$f" ] && [ -e "$f" ] || continue
  case "$f" in "$HOME"/*) dest=/root${f#"$HOME"} ;; *) dest=$f ;; esac
  copy_in "$f" "$dest"
  if [ -d "$f" ]; then pip_confs+=("$f"/*.conf); else pip_confs+=("$f"); fi
done
pip_paths() {
  { [ "${#pip_confs[@]}" = 0 ] || grep -hv '^[[:space:]]*[#;]' "${pip_confs[@]}" 2>/dev/null
    compgen -e | while read -r var; do case "$var" in PIP_*) echo "${!var}" ;; esac; done
  } | grep -oE '(^|[[:space:]=])(file://)?/[^[:space:]"'\'',;]+' |
    sed -E 's#^[[:space:]=]##; s#^file://##; s#/+$##' | sort -u
}
for p in $(pip_paths); do
  [ -n "$p" ] && [ -e "$p" ] || continue
  if [ -d "$p" ]; then
    [ "$(basename "$p")" = simple ] && p=$(dirname "$p")   # a file:// index: its files lie beside
    case "$WORK/" in "$p"/*) continue ;; esac               # never the folder holding the root
    if [ -d "$ROOT$p" ] && [ -n "$(ls -A "$ROOT$p" 2>/dev/null)" ]; then continue; fi
    say "sharing the local package folder $p (read-only)"
    bind "$p" "$ROOT$p" ro
  elif [ ! -e "$ROOT$p" ]; then
    copy_in "$p" "$p"
  fi
done

# --- 3. clone -------------------------------------------------------------------------------------
step "clone"
bind "$GIT_DIR_SRC" "$ROOT/src.git" ro
in_root git -c safe.directory='*' clone -q --no-hardlinks --no-checkout /src.git /root/chexnet-at-scale
in_root git -C /root/chexnet-at-scale cat-file -e "$SHA^{commit}" 2>/dev/null ||
  die "commit $SHA is on no branch of $GIT_DIR_SRC, so a clone does not have it: commit on a branch"
in_root git -C /root/chexnet-at-scale -c advice.detachedHead=false checkout -q "$SHA"
umount "$ROOT/src.git" && rmdir "$ROOT/src.git"
say "cloned $(in_root git -C /root/chexnet-at-scale log -1 --format='%h %s' | cut -c1-90)"

# --- 4. make setup --------------------------------------------------------------------------------
step "make setup"
if [ "${FRESH_NO_CACHE:-0}" = 1 ]; then
  say "FRESH_NO_CACHE=1: nothing shared, Horovod is built in the root"
else
  mkdir -p "$CACHE_DIR"
  say "sharing the Horovod wheel cache $CACHE_DIR"
  bind "$CACHE_DIR" "$ROOT/root/.cache/chexnet-at-scale/wheels"
fi
in_root /bin/bash -c 'cd /root/chexnet-at-scale && make setup'

# --- 5. notebook 00 (the Makefile's nbval command; setup is done) -----------------------------------
step "notebook 00"
# as the bare Debian's root, outside any container: the README's opt-in for running Jupyter and
# Open MPI as root (chexnet_utils/platform/root.py)
in_root env CHEXNET_ALLOW_ROOT=1 /bin/bash -c \
  'cd /root/chexnet-at-scale && make -o setup notebooks NOTEBOOKS=notebooks/00_environment_check.ipynb'
end_step
