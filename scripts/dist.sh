#!/usr/bin/env bash
# `make dist`: the release tarball a user downloads and loads.
#
#   target/dist/xcloak-<version>-linux-x86_64.tar.gz (+ .sha256 beside it)
#     xcloak-<version>-linux-x86_64/
#       libxcloak.so         built against glibc 2.17 with zig (cargo zigbuild)
#       redis.conf.example   loads ./libxcloak.so (start it from this folder)
#       lua/*.lua            the fallback for servers that cannot load modules
#       INSTALL.md README.md CHANGELOG.md LICENSE
#       THIRD-PARTY.md       the crates compiled into libxcloak.so, with their licenses
#       BUILD-INFO           commit, rustc, cargo-zigbuild and zig versions
#       SHA256SUMS           of every other file
#
# Reproducible: the same commit, rustc, cargo-zigbuild and zig give the same
# bytes, in any folder (paths are remapped), and the same tarball (sorted
# names, owner 0, mtimes from the commit date, gzip -n).
#
# Installs what is missing, pinned: cargo-zigbuild from crates.io
# (`cargo install --locked`, into cargo's bin folder) and zig from the PyPI
# wheel `ziglang` (unpacked into ${XCLOAK_TOOLS_CACHE:-~/.cache/xcloak-tools};
# pip is only asked to download it, so no Python environment is modified).
set -euo pipefail
cd "$(dirname "$0")/.."

CARGO_ZIGBUILD_VERSION=0.24.1
ZIG_VERSION=0.14.1
GLIBC=2.17
TRIPLE=x86_64-unknown-linux-gnu

say() { echo "dist: $*" >&2; }

scripts/ensure-deps.sh

version=$(sed -n 's/^version *= *"\(.*\)"/\1/p' Cargo.toml | head -n1)
[ -n "$version" ] || { say "no version in Cargo.toml"; exit 1; }
name="xcloak-$version-linux-x86_64"

# Timestamps come from the commit, not from the clock.
if [ -z "${SOURCE_DATE_EPOCH:-}" ]; then
    SOURCE_DATE_EPOCH=$(git log -1 --format=%ct 2>/dev/null) \
        || { say "not a git checkout: set SOURCE_DATE_EPOCH"; exit 1; }
fi
export SOURCE_DATE_EPOCH
commit=$(git rev-parse HEAD 2>/dev/null || echo unknown)
if [ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ]; then
    say "warning: uncommitted changes: this build is not the one of commit $commit"
    commit="$commit (modified)"
fi

# --- tools ----------------------------------------------------------------
if [ "$(cargo-zigbuild --version 2>/dev/null)" != "cargo-zigbuild $CARGO_ZIGBUILD_VERSION" ]; then
    say "installing cargo-zigbuild $CARGO_ZIGBUILD_VERSION (crates.io)"
    cargo install --quiet --locked --force cargo-zigbuild --version "$CARGO_ZIGBUILD_VERSION"
fi

tools="${XCLOAK_TOOLS_CACHE:-$HOME/.cache/xcloak-tools}"
zig_dir="$tools/ziglang-$ZIG_VERSION"
zig="$zig_dir/ziglang/zig"
if [ "$("$zig" version 2>/dev/null)" != "$ZIG_VERSION" ]; then
    say "installing zig $ZIG_VERSION (PyPI wheel ziglang) into $zig_dir"
    pip=()
    if command -v pip3 >/dev/null 2>&1; then pip=(pip3)
    elif python3 -m pip --version >/dev/null 2>&1; then pip=(python3 -m pip)
    else
        sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
        DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends python3-pip >/dev/null
        pip=(pip3)
    fi
    rm -rf "$zig_dir" && mkdir -p "$zig_dir/wheel"
    "${pip[@]}" download --quiet --no-deps --only-binary=:all: --platform manylinux_2_12_x86_64 \
        -d "$zig_dir/wheel" "ziglang==$ZIG_VERSION" >&2
    python3 -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])' \
        "$(ls "$zig_dir"/wheel/*.whl | head -n1)" "$zig_dir"
    chmod +x "$zig"
    rm -rf "$zig_dir/wheel"
    [ "$("$zig" version)" = "$ZIG_VERSION" ] || { say "$zig is not zig $ZIG_VERSION"; exit 1; }
fi
export CARGO_ZIGBUILD_ZIG_PATH="$zig"

# --- build ----------------------------------------------------------------
# RUSTFLAGS replaces, never extends, the caller's: the flags are part of the
# bytes. The remaps keep this folder and cargo's home out of panic locations.
cargo_home="${CARGO_HOME:-$HOME/.cargo}"
export RUSTFLAGS="--remap-path-prefix=$PWD=/xcloak --remap-path-prefix=$cargo_home=/cargo"
unset CARGO_ENCODED_RUSTFLAGS CARGO_BUILD_RUSTFLAGS
say "building $name (cargo zigbuild --release --target $TRIPLE.$GLIBC)"
cargo zigbuild --locked --release --target "$TRIPLE.$GLIBC"
module="target/$TRIPLE/release/libxcloak.so"

# --- stage ----------------------------------------------------------------
out=target/dist
stage="$out/stage/$name"
rm -rf "$out/stage" "$out/$name.tar.gz" "$out/$name.tar.gz.sha256"
mkdir -p "$stage/lua"
install -m 755 "$module" "$stage/libxcloak.so"
install -m 644 README.md CHANGELOG.md LICENSE "$stage/"
install -m 644 docs/install.md "$stage/INSTALL.md"
install -m 644 src/lua/*.lua "$stage/lua/"
# The repository's example loads target/release/libxcloak.so; the release's
# loads the module beside it.
sed -e 's|^loadmodule \./target/release/libxcloak\.so|loadmodule ./libxcloak.so|' \
    -e 's|^# `make run` starts: redis-server redis.conf.example --port 6379|# Start it from this folder: redis-server redis.conf.example|' \
    -e 's|^# (run from the repository root, so the relative module path below resolves)\.|# (the relative module path below resolves from there).|' \
    redis.conf.example > "$stage/redis.conf.example"
grep -q '^loadmodule \./libxcloak\.so' "$stage/redis.conf.example" \
    || { say "redis.conf.example: no 'loadmodule ./target/release/libxcloak.so' line to rewrite"; exit 1; }

# The crates linked into the module (no build-time or proc-macro crates; not
# xcloak-core, the workspace's own core, under xcloak's LICENSE),
# with the license text each ships (MIT where it offers a choice).
crates=$(cargo tree --locked --edges normal,no-proc-macro --prefix none --target "$TRIPLE" \
    --format '{p} {l}' | sed 's/ (\*)$//' | grep -v -E '^xcloak(-core)? ' | LC_ALL=C sort -u)
{
    echo "# Third-party code in libxcloak.so"
    echo
    echo "libxcloak.so is xcloak (MIT, see LICENSE) statically linked with the Rust"
    echo "standard library (MIT OR Apache-2.0) and the crates below (versions from"
    echo "Cargo.lock). It links dynamically against the system's glibc only."
    echo
    echo "| crate | version | license |"
    echo "|---|---|---|"
    while read -r crate crate_version license; do
        echo "| $crate | ${crate_version#v} | $license |"
    done <<< "$crates"
    while read -r crate crate_version license; do
        dir=$(ls -d "$cargo_home"/registry/src/*/"$crate-${crate_version#v}" | head -n1)
        echo
        echo "## $crate ${crate_version#v} ($license)"
        echo
        text=""
        for candidate in LICENSE-MIT LICENSE-MIT.md LICENSE LICENSE.md LICENSE.txt COPYING LICENSE-APACHE; do
            if [ -f "$dir/$candidate" ]; then text=$candidate; break; fi
        done
        if [ -z "$text" ]; then
            echo "The crate ships no license file; its Cargo.toml declares $license."
            continue
        fi
        echo '```'
        cat "$dir/$text"
        echo '```'
    done <<< "$crates"
} > "$stage/THIRD-PARTY.md"
chmod 644 "$stage/THIRD-PARTY.md"

{
    echo "xcloak $version"
    echo "commit: $commit"
    echo "commit date (SOURCE_DATE_EPOCH): $SOURCE_DATE_EPOCH"
    echo "target: $TRIPLE, glibc $GLIBC and newer"
    echo "rustc: $(rustc --version)"
    echo "cargo-zigbuild: $CARGO_ZIGBUILD_VERSION"
    echo "zig: $ZIG_VERSION (PyPI ziglang)"
    echo "build: cargo zigbuild --locked --release --target $TRIPLE.$GLIBC"
    echo "RUSTFLAGS: --remap-path-prefix=<source folder>=/xcloak --remap-path-prefix=<CARGO_HOME>=/cargo"
} > "$stage/BUILD-INFO"
chmod 644 "$stage/BUILD-INFO"

(cd "$stage" && find . -type f ! -name SHA256SUMS | sed 's|^\./||' | LC_ALL=C sort | xargs sha256sum > SHA256SUMS)
chmod 644 "$stage/SHA256SUMS"
chmod 755 "$stage" "$stage/lua"

# --- pack -----------------------------------------------------------------
LC_ALL=C tar --sort=name --format=gnu --mtime="@$SOURCE_DATE_EPOCH" \
    --owner=0 --group=0 --numeric-owner -C "$out/stage" -cf - "$name" \
    | gzip -n -9 > "$out/$name.tar.gz"
(cd "$out" && sha256sum "$name.tar.gz" > "$name.tar.gz.sha256")
rm -rf "$out/stage"

say "wrote $out/$name.tar.gz"
cat "$out/$name.tar.gz.sha256"
