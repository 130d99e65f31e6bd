#!/usr/bin/env bash
# The C ABI of liblease against the committed baseline (libabigail's abidw /
# abidiff, Debian package abigail-tools), two views:
#   ffi/abi/liblease.abi  abidw of the built liblease.so: its SONAME and its
#                         exported symbols;
#   ffi/abi/lease-h.abi   abidw of a probe built from include/lease.h (which
#                         scripts/check-header.sh keeps equal to ffi/src): one
#                         exported variable per API function, typed as a
#                         pointer to it, so the DWARF holds every signature and
#                         every struct and enum reachable from one. (Rust's own
#                         DWARF is not readable as C types by abidw.)
# Fails when abidiff reports a removed or changed function, variable or symbol
# while the SONAME is the same as the baseline's. Added functions pass (they
# are compatible): refresh the baseline then. A new SONAME (0.x: every minor;
# then every major, ffi/build.rs) passes with a note to refresh the baseline.
#   --update   rewrite the baseline (after a release, or an intended SONAME change)
# LEASE_SO=path checks that library instead of building target/release/liblease.so.
# abigail-tools is installed when missing if we are root (as CI is); otherwise
# the check is skipped with a message saying how to install it.
set -euo pipefail
cd "$(dirname "$0")/.."
CARGO=${CARGO:-cargo}
base=ffi/abi

if ! command -v abidw >/dev/null || ! command -v abidiff >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "abi: installing abigail-tools (abidw, abidiff)..." >&2
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq abigail-tools >/dev/null
  else
    echo "abi: SKIPPED: abidw/abidiff are not installed and this user cannot install packages;" >&2
    echo "     install them with: sudo apt-get install abigail-tools   (then rerun scripts/check-abi.sh)" >&2
    exit 0
  fi
fi
command -v cc >/dev/null || { echo "error: cc is needed to build the header probe" >&2; exit 1; }

if [ -n "${LEASE_SO:-}" ]; then
  lib=$LEASE_SO   # an already built liblease.so (stripped is fine: only its dynamic symbols are read)
else
  $CARGO build --release -p quotalease-ffi --quiet
  target_dir=$($CARGO metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
  lib=$target_dir/release/liblease.so
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/quotalease-abi.XXXXXX")
trap 'rm -rf "$work"' EXIT

# The probe: every function lease.h declares, as an exported typed pointer.
funcs=$(grep -oE '\blease_[a-z0-9_]+\(' include/lease.h | tr -d '(' | sort -u)
{
  echo '#include <lease.h>'
  for f in $funcs; do
    # A name followed by "(" in a comment is not a function: keep declared ones only.
    if grep -qE "^[a-z_ ]*[ *]$f\(" include/lease.h; then
      echo "__typeof__(&$f) const abi_$f = 0;"
    fi
  done
} >"$work/probe.c"
cc -shared -fPIC -g -O0 -Iinclude "$work/probe.c" -o "$work/lease-h.so"

abidw_() { abidw --no-show-locs --no-comp-dir-path --no-corpus-path --no-elf-needed --exported-interfaces-only --type-id-style hash "$@"; }
abidw_ "$lib" >"$work/liblease.abi"
abidw_ "$work/lease-h.so" >"$work/lease-h.abi"
nfunc=$(grep -c "<var-decl name='abi_lease_" "$work/lease-h.abi" || true)
nsym=$(grep -c "<elf-symbol name='lease_" "$work/liblease.abi" || true)
[ "$nfunc" -gt 0 ] && [ "$nfunc" = "$nsym" ] || {
  echo "error: the header probe has $nfunc functions, liblease.so exports $nsym lease_* symbols" >&2
  exit 1
}

if [ "${1:-}" = "--update" ]; then
  mkdir -p "$base"
  cp "$work/liblease.abi" "$work/lease-h.abi" "$base/"
  echo "abi: $base/liblease.abi and $base/lease-h.abi updated ($nsym functions); commit them"
  exit 0
fi

soname_of() { sed -n "s/.*<abi-corpus [^>]*soname='\([^']*\)'.*/\1/p" "$1" | head -n 1; }
old_soname=$(soname_of "$base/liblease.abi")
new_soname=$(soname_of "$work/liblease.abi")
status=0
for view in liblease lease-h; do
  set +e
  abidiff --no-show-locs "$base/$view.abi" "$work/$view.abi" >"$work/$view.diff"
  rc=$?
  set -e
  if [ $((rc & 3)) != 0 ]; then
    cat "$work/$view.diff" >&2
    echo "error: abidiff failed on $view (exit $rc)" >&2
    exit 1
  fi
  if [ "$rc" = 0 ]; then
    echo "abi: $view: no change against $base/$view.abi"
    continue
  fi
  # Removed or changed entries are breaking; added ones are not.
  breaking=$(grep -E '(Functions|Variables) changes summary|(Function|Variable) symbols changes summary' "$work/$view.diff" |
    grep -E '[1-9][0-9]* Removed|[1-9][0-9]* Changed' || true)
  if [ "$rc" -ge 8 ] || [ -n "$breaking" ]; then
    if [ "$old_soname" != "$new_soname" ]; then
      sed 's/^/   /' "$work/$view.diff"
      echo "abi: $view: incompatible change with a new SONAME ($old_soname -> $new_soname): allowed;" \
        "refresh the baseline: scripts/check-abi.sh --update"
    else
      sed 's/^/   /' "$work/$view.diff" >&2
      echo "error: $view: incompatible ABI change (above) and the SONAME is still $new_soname." >&2
      echo "  Either keep the old functions and types as they were (add new ones instead)," >&2
      echo "  or bump the version so the SONAME changes (scripts/bump-version.sh: 0.x -> next minor)," >&2
      echo "  then scripts/check-abi.sh --update. Before the first release the baseline may simply be refreshed." >&2
      status=1
    fi
  else
    sed 's/^/   /' "$work/$view.diff"
    echo "abi: $view: compatible additions only; refresh the baseline when convenient: scripts/check-abi.sh --update"
  fi
done
[ "$status" = 0 ] && echo "abi: liblease ($new_soname, $nsym functions) is compatible with $base"
exit "$status"
