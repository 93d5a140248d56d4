#!/usr/bin/env bash
# The digests that guard Horovod's source and the cached Horovod wheel (issue 30 item 4); used
# by scripts/setup.sh, one command per call:
#
#   digests.sh unpack-sdist TARBALL SHA256 DEST
#       checks TARBALL against SHA256 (PyPI's published digest of horovod-<version>.tar.gz,
#       written in requirements/horovod.txt) and only then unpacks it into DEST; a mismatch
#       unpacks nothing and exits 1 naming both digests
#   digests.sh seal-wheel WHEEL
#       right after a build: writes WHEEL.sha256 next to it ("<sha256>  <name>", as sha256sum)
#       and makes both read-only (mode 444)
#   digests.sh verify-wheel WHEEL
#       exit 0: WHEEL matches WHEEL.sha256, and neither file can be rewritten by another
#       account (no group/other write bit; owned by this account, root or the owner of the
#       cache's wheels/ folder). Exit 1 (with the reason): a mismatch, or a file another
#       account could have changed. Exit 2: no WHEEL.sha256 (a cache entry made before digests
#       were written: setup builds it again)
#   digests.sh install-wheel WHEEL PYTHON
#       verify-wheel, then `PYTHON -m pip install --require-hashes --no-deps --force-reinstall`
#       of WHEEL with that digest (pip checks it once more as it reads the file)
#
# A digest next to the wheel proves the wheel is the one that was built, as long as the digest
# itself cannot be rewritten by whoever could replace the wheel: hence the owner and mode check
# (on a shared cache: docs/facilitator.md).
set -euo pipefail
say() { printf '\033[1m[setup]\033[0m %s\n' "$*"; }
err() { printf '\033[1m[setup]\033[0m %s\n' "$*" >&2; }
sha256_of() { sha256sum "$1" | cut -d' ' -f1; }

# owner and mode: a file another account can write, or owned by an account we do not trust
writable_by_others() {   # prints why, or nothing
  local f=$1 trusted_owner=$2 uid mode
  read -r uid mode < <(stat -c '%u %a' "$f")
  if (( 8#$mode & 8#022 )); then
    echo "$f is writable by its group or by every account (mode $mode)"
  elif [ "$uid" != "$(id -u)" ] && [ "$uid" != 0 ] && [ "$uid" != "$trusted_owner" ]; then
    echo "$f belongs to another account (uid $uid), not to you, root or the cache's owner"
  fi
}

cmd=${1:-}; shift || true
case "$cmd" in
  unpack-sdist)
    [ $# = 3 ] || { err "usage: $0 unpack-sdist TARBALL SHA256 DEST"; exit 2; }
    tarball=$1 want=$2 dest=$3
    got=$(sha256_of "$tarball")
    if [ "$got" != "$want" ]; then
      err "REFUSED: $tarball is not Horovod's published source: its sha256 is $got, PyPI's digest" \
          "for $(basename "$tarball") (requirements/horovod.txt) is $want. Nothing was unpacked." \
          "If the file was changed after it was downloaded, remove it (rm '$tarball') and run" \
          "make setup again to download it afresh."
      exit 1
    fi
    tar -xzf "$tarball" -C "$dest"
    ;;
  seal-wheel)
    [ $# = 1 ] || { err "usage: $0 seal-wheel WHEEL"; exit 2; }
    wheel=$1
    (cd "$(dirname "$wheel")" && sha256sum "$(basename "$wheel")" > "$(basename "$wheel").sha256")
    chmod 444 "$wheel" "$wheel.sha256"
    ;;
  verify-wheel|install-wheel)
    if [ "$cmd" = verify-wheel ]; then [ $# = 1 ] || { err "usage: $0 verify-wheel WHEEL"; exit 2; }
    else [ $# = 2 ] || { err "usage: $0 install-wheel WHEEL PYTHON"; exit 2; }; fi
    wheel=$1
    [ -f "$wheel" ] || { err "no wheel $wheel"; exit 1; }
    if [ ! -f "$wheel.sha256" ]; then
      err "$wheel has no digest file ($(basename "$wheel").sha256) next to it: it was not made by" \
          "this setup (or by an older one)"
      exit 2
    fi
    cache_owner=$(stat -c '%u' "$(dirname "$(dirname "$wheel")")" 2>/dev/null || echo 0)
    for f in "$wheel" "$wheel.sha256"; do
      why=$(writable_by_others "$f" "$cache_owner")
      if [ -n "$why" ]; then
        err "REFUSED: $why: anyone able to change it could replace the wheel and its digest" \
            "together, so the digest proves nothing. Rebuild it in a cache only you (or the" \
            "facilitator) can write: rm -rf '$(dirname "$wheel")' && make setup"
        exit 1
      fi
    done
    want=$(cut -d' ' -f1 "$wheel.sha256")
    got=$(sha256_of "$wheel")
    if [ "$got" != "$want" ]; then
      err "REFUSED: the cached Horovod wheel $wheel was changed after it was built: its sha256 is" \
          "$got, the digest written at build time ($(basename "$wheel").sha256) is $want." \
          "Nothing was installed. Remove the cache entry and build it again:" \
          "rm -rf '$(dirname "$wheel")' && make setup"
      exit 1
    fi
    if [ "$cmd" = install-wheel ]; then
      req=$(mktemp); trap 'rm -f "$req"' EXIT
      echo "horovod @ file://$(realpath "$wheel") --hash=sha256:$want" > "$req"
      "$2" -m pip --disable-pip-version-check install -q --require-hashes --no-deps \
        --force-reinstall -r "$req"
    fi
    ;;
  *) err "usage: $0 unpack-sdist|seal-wheel|verify-wheel|install-wheel ..."; exit 2 ;;
esac
