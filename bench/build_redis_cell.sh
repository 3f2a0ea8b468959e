#!/bin/sh
# Build redis-cell (brandur/redis-cell, the native CL.THROTTLE module) for bench/core.py,
# offline, from Debian's Rust crates. v0.3.1 is the newest release whose dependencies
# (bitflags 1, libc 0.2, time 0.1, cc 1.0) Debian bookworm ships; later ones want
# bitflags >= 2.6. Needs cargo, and a checkout of redis-cell at tag v0.3.1:
#
#   REDIS_CELL_SRC=/path/to/redis-cell bench/build_redis_cell.sh
#
# The module lands in build/redis-cell/libredis_cell.so, where bench/core.py and
# bench/run.py load it into their private redis-server (REDIS_CELL_MODULE names another).
set -eu
SRC=${REDIS_CELL_SRC:?a checkout of brandur/redis-cell at v0.3.1}
OUT=$(cd "$(dirname "$0")/.." && pwd)/build/redis-cell
DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
  librust-bitflags-dev librust-libc-dev librust-time-0.1-dev librust-cc-dev gcc
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
cp -r "$SRC"/. "$WORK"
mkdir -p "$WORK/.cargo"
cat > "$WORK/.cargo/config.toml" <<'CFG'
[source.crates-io]
replace-with = "debian"

[source.debian]
directory = "/usr/share/cargo/registry"

[net]
offline = true
CFG
(cd "$WORK" && cargo build --release --offline)
mkdir -p "$OUT"
cp "$WORK/target/release/libredis_cell.so" "$OUT/"
echo "built $OUT/libredis_cell.so"
