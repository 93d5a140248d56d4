#!/usr/bin/env bash
# The package as a normal user on a multi-user host (#30): CI runs as root, which hides what
# a learner's account meets on a shared workshop machine. As root, this script
#   1. creates two accounts: a learner and "another account";
#   2. as the other account, keeps a process running that holds an Open MPI shared-memory
#      segment in /dev/shm (and leaves a second one unheld), both touched every 0.5 s, as
#      another learner's job would (neither may be deleted by anyone but their owner);
#   3. as the learner, with a clean environment and the checkout read-only to it, runs the
#      unit layer, notebook 00 under nbval, one engine-cluster test (a rank killed with
#      SIGKILL, so MPICluster.stop() has a segment of the learner's own to clean up) and the
#      one-machine Slurm's first test (its daemons as the learner, on loopback only);
#   4. checks that the other account's segments and process are untouched, also after this
#      script (root) ran the same orphan clean-up;
#   5. removes both accounts, their processes and every file they made in /tmp and /dev/shm,
#      and checks that nothing is left.
# The accounts get uids that own no file in /tmp, /dev/shm, /var/tmp or /home, and the
# clean-up deletes only files made after this script started (their inode change time: a
# test may set a file's modification time into the past): on a machine shared with other
# work, an archive unpacked as root keeps its owners' uids (Horovod's sdist: 1001), and those
# files are not the accounts' to delete.
# PY: the interpreter whose packages are used (default: the checkout's .venv). Exit status:
# the tests', or 1 when a check fails, 2 when not root.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
PY=${PY:-$repo/.venv/bin/python}
LPY=$PY
if [ "$(id -u)" != 0 ]; then
  echo "nonroot-check: needs root (it creates and removes two accounts)" >&2
  exit 2
fi
tag=$(od -An -N3 -tx1 /dev/urandom | tr -d ' \n')
learner=chexnet-learner-$tag
other=chexnet-other-$tag
host=$(hostname)
held=/dev/shm/vader_segment.$host.${tag}01.0
unheld=/dev/shm/vader_segment.$host.${tag}02.0
holder=

fail() { echo "nonroot-check: FAILED: $*" >&2; exit 1; }

# pids of every process of account $1
pids_of() { ps -e -o pid=,user:40= | awk -v u="$1" '$2 == u {print $1}'; }

cleanup() {
  local status=$? uid u p left clean=1
  set +e
  [ -n "$holder" ] && kill "$holder" 2>/dev/null
  for u in "$learner" "$other"; do
    uid=$(id -u "$u" 2>/dev/null) || continue
    for p in $(pids_of "$u"); do kill -KILL "$p" 2>/dev/null; done
    for _ in $(seq 50); do [ -z "$(pids_of "$u")" ] && break; sleep 0.1; done
    find /tmp /dev/shm /var/tmp -xdev -depth -uid "$uid" -cnewer "$stamp" -delete 2>/dev/null
    userdel --remove "$u" 2>/dev/null
    left=$( (id "$u" 2>/dev/null; pids_of "$u"; find /tmp /dev/shm /var/tmp /home -xdev \
      -uid "$uid" -cnewer "$stamp" 2>/dev/null) | head -5)
    if [ -n "$left" ] || [ -e "/home/$u" ]; then
      echo "nonroot-check: cleanup left behind for $u: $left" >&2
      status=1 clean=
    fi
  done
  [ -n "$clean" ] && echo "nonroot-check: accounts $learner and $other removed, nothing left"
  rm -f "$stamp"
  exit "$status"
}
stamp=$(mktemp)   # files made after this one are the accounts' to remove
trap cleanup EXIT

# a uid (and gid) no account or group has and no file in the shared folders carries
free_uid() {
  local n=$1
  while getent passwd "$n" >/dev/null || getent group "$n" >/dev/null \
      || [ -n "$(find /tmp /dev/shm /var/tmp /home -xdev \( -uid "$n" -o -gid "$n" \) \
                  -print -quit 2>/dev/null)" ]; do
    n=$((n + 1))
  done
  echo "$n"
}
uid=$(free_uid 2000)
useradd --create-home --user-group --uid "$uid" --shell /bin/sh "$learner"
uid=$(free_uid $((uid + 1)))
useradd --create-home --user-group --uid "$uid" --shell /bin/sh "$other"
# as <account> <command...>: that account's ids and groups, a clean environment (only
# PYTHONPATH passes through, for a run with another checkout's interpreter); AS_EXEC=1: exec
as() {
  local u=$1 home
  shift
  home=$(getent passwd "$u" | cut -d: -f6)
  ${AS_EXEC:+exec} setpriv --reuid="$u" --regid="$u" --init-groups -- env -i HOME="$home" \
    USER="$u" LOGNAME="$u" LANG=C.UTF-8 PATH="$(dirname "$LPY"):/usr/local/bin:/usr/bin:/bin" \
    PYTHONDONTWRITEBYTECODE=1 TF_CPP_MIN_LOG_LEVEL=2 \
    PYDEVD_DISABLE_FILE_VALIDATION=1 CHEXNET_WORK_DIR="$home/build" \
    ${PYTHONPATH:+PYTHONPATH="$PYTHONPATH"} "$@"
}
for f in Makefile notebooks/00_environment_check.ipynb; do
  as "$learner" test -r "$f" || fail "$learner cannot read $f (the checkout must be readable)"
done
# The learner's interpreter: the checkout's, if other accounts may run it. Here it may not:
# the venv's Python lives in root's home (pyenv under /root, mode 0700). Then the learner
# gets a venv of the system Python of the same version whose site-packages is the
# checkout's (read-only to it) and whose console scripts (horovodrun, ...) start it.
LPY=$PY
if ! as "$learner" "$PY" -c pass 2>/dev/null; then
  ver=$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
  prefix=$("$PY" -c 'import sys; print(sys.prefix)')
  site=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  base=/usr/bin/python$ver
  [ -x "$base" ] || fail "$PY is not usable by other accounts and there is no $base"
  lvenv=$(getent passwd "$learner" | cut -d: -f6)/venv
  as "$learner" "$base" -m venv --without-pip "$lvenv"
  as "$learner" rm -rf "$lvenv/lib/python$ver/site-packages"
  as "$learner" ln -s "$site" "$lvenv/lib/python$ver/site-packages"
  for f in "$prefix"/bin/*; do
    if [ -f "$f" ] && [ ! -e "$lvenv/bin/${f##*/}" ] \
        && head -n 1 "$f" | grep -qx "#!$prefix/bin/python[0-9.]*"; then
      { echo "#!$lvenv/bin/python"; tail -n +2 "$f"; } > "$lvenv/bin/${f##*/}"
      chmod 755 "$lvenv/bin/${f##*/}"
      chown "$learner:" "$lvenv/bin/${f##*/}"
    fi
  done
  LPY=$lvenv/bin/python
  echo "nonroot-check: $PY is not usable by other accounts; the learner runs $LPY" \
    "($("$base" -V), the checkout's packages)"
fi

# the other account: a process holding one segment open, a second segment unheld
AS_EXEC=1 as "$other" /bin/sh -c \
  'exec 3<>"$1"; while :; do printf x >&3; touch "$2"; sleep 0.5; done' sh "$held" "$unheld" &
holder=$!
for _ in $(seq 50); do [ -e "$unheld" ] && break; sleep 0.1; done
[ -e "$held" ] && [ -e "$unheld" ] || fail "the other account's segments were not created"
echo "nonroot-check: $other (uid $(id -u "$other")) holds $held (pid $holder), left $unheld"

others_intact() {
  [ -e "$held" ] && [ -e "$unheld" ] || fail "$1 deleted the other account's segments"
  kill -0 "$holder" 2>/dev/null || fail "the other account's process died during $1"
}

echo "nonroot-check: as $learner (uid $(id -u "$learner")): unit layer, notebook 00, an engine cluster, a local Slurm"
start=$(date +%s)
as "$learner" "$LPY" -m pytest -p no:cacheprovider -q --durations=5 tests/unit \
  notebooks/00_environment_check.ipynb --nbval-lax --nbval-current-env \
  --nbval-sanitize-with tests/nbval_sanitize.cfg \
  "tests/mpi/test_cluster.py::test_killed_engine_fails_the_call_quickly_and_teardown_is_clean" \
  "tests/mpi/test_slurm.py::test_local_slurm_runs_as_its_user_on_loopback_only_and_stops_every_daemon"
echo "nonroot-check: the tests took $(( $(date +%s) - start )) s as $learner"
others_intact "the learner's tests"

# an unauthenticated server beside another account's process: refused, nothing started (#30)
as "$learner" "$LPY" -c 'from chexnet_utils.platform.exposure import SharedHostError
from chexnet_utils.input.tfdata_service import TFDataService
svc = TFDataService(num_workers=1)
try:
    svc.start()
except SharedHostError as e:
    assert svc.dispatcher is None and not svc.workers
    print("nonroot-check: the tf.data service refused to start:", str(e)[:110], "...")
else:
    svc.stop()
    raise SystemExit("the tf.data service started beside another account")' \
  || fail "the tf.data service did not refuse on a shared host"

# the clean-up itself, as the learner and as root: neither touches another account's segments
as "$learner" "$LPY" -c 'from chexnet_utils.platform.processes import remove_orphan_shm_segments as r
print("nonroot-check: the learner removed its own orphans:", r())' \
  || fail "remove_orphan_shm_segments raised for the learner"
others_intact "the learner's orphan clean-up"
"$PY" -c 'from chexnet_utils.platform.processes import orphan_shm_segments as o; import sys, os
sys.exit(f"would remove {o()}" if any(os.stat(p).st_uid != 0 for p in o()) else 0)' \
  || fail "root would remove other accounts' segments"
others_intact "root's orphan clean-up"
echo "nonroot-check: passed; the other account's segments and process are untouched"
