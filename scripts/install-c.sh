#!/usr/bin/env bash
# `make install PREFIX=... [DESTDIR=...]`: build liblease in release mode and
# install it, the header and a pkg-config file:
#   $PREFIX/lib/liblease.so.X.Y.Z, liblease.so.<soname>, liblease.so, liblease.a
#   $PREFIX/include/lease.h
#   $PREFIX/lib/pkgconfig/lease.pc
# Then: cc app.c $(pkg-config --cflags --libs lease)   (with PKG_CONFIG_PATH=$PREFIX/lib/pkgconfig
# unless PREFIX is a directory pkg-config searches already, such as /usr/local).
# `make dist` reuses this script for the release archive: LEASE_LIB_DIR names a
# directory with an already built liblease.so and liblease.a (no cargo build
# then), and LEASE_PC_PREFIX is written as lease.pc's prefix instead of PREFIX
# (the archive's is '${pcfiledir}/../..', so it works wherever it is extracted).
set -euo pipefail
cd "$(dirname "$0")/.."
PREFIX=${PREFIX:-/usr/local}
DESTDIR=${DESTDIR:-}
CARGO=${CARGO:-cargo}
case "$PREFIX" in
  /*) ;;
  *) echo "error: PREFIX must be an absolute path (got '$PREFIX')" >&2; exit 2 ;;
esac

if [ -n "${LEASE_LIB_DIR:-}" ]; then
  rel=$LEASE_LIB_DIR
else
  $CARGO build --release -p quotalease-ffi --quiet
  target_dir=$($CARGO metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
  rel="$target_dir/release"
fi
pc_prefix=${LEASE_PC_PREFIX:-$PREFIX}

major=$(sed -n 's/^#define LEASE_VERSION_MAJOR \([0-9]*\)$/\1/p' include/lease.h)
minor=$(sed -n 's/^#define LEASE_VERSION_MINOR \([0-9]*\)$/\1/p' include/lease.h)
patch=$(sed -n 's/^#define LEASE_VERSION_PATCH \([0-9]*\)$/\1/p' include/lease.h)
version="$major.$minor.$patch"
# Same rule as ffi/build.rs: 0.x breaks the ABI at every minor.
if [ "$major" = 0 ]; then soname="liblease.so.0.$minor"; else soname="liblease.so.$major"; fi

lib="$DESTDIR$PREFIX/lib"
inc="$DESTDIR$PREFIX/include"
pc="$lib/pkgconfig"
install -d "$lib" "$inc" "$pc"
install -m 0755 "$rel/liblease.so" "$lib/liblease.so.$version"
ln -sfn "liblease.so.$version" "$lib/$soname"
ln -sfn "$soname" "$lib/liblease.so"
install -m 0644 "$rel/liblease.a" "$lib/liblease.a"
install -m 0644 include/lease.h "$inc/lease.h"
sed -e "s|@PREFIX@|$pc_prefix|" -e "s|@VERSION@|$version|" \
    -e "s|@NATIVE_LIBS@|-lgcc_s -lutil -lrt -lpthread -lm -ldl -lc|" \
    ffi/lease.pc.in > "$pc/lease.pc"
chmod 0644 "$pc/lease.pc"
echo "installed liblease $version into $DESTDIR$PREFIX (pkg-config: $pc/lease.pc)"
