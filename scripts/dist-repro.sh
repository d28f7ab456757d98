#!/usr/bin/env bash
# `make dist-repro`: checks that the release build is reproducible. Builds the
# tarball here (`make dist`), then again from a fresh clone of the same commit
# in a temporary folder, with its own empty target/, and compares the SHA-256
# of both libxcloak.so and both tarballs. Not part of CI (it builds twice).
set -euo pipefail
cd "$(dirname "$0")/.."

say() { echo "dist-repro: $*" >&2; }
if [ -n "$(git status --porcelain --untracked-files=no)" ]; then
    say "uncommitted changes: commit first (the clone builds the commit)"
    exit 1
fi
version=$(sed -n 's/^version *= *"\(.*\)"/\1/p' Cargo.toml | head -n1)
name="xcloak-$version-linux-x86_64"
commit=$(git rev-parse HEAD)

scripts/dist.sh >/dev/null
work=$(mktemp -d "${TMPDIR:-/tmp}/xcloak-dist-repro.XXXXXX")
trap 'rm -rf "$work"' EXIT
git clone --quiet --no-hardlinks . "$work/xcloak"
git -C "$work/xcloak" checkout --quiet --detach "$commit"
say "building $commit again in $work/xcloak"
(cd "$work/xcloak" && scripts/dist.sh >/dev/null)

so_hash() { tar -xzOf "$1" "$name/libxcloak.so" | sha256sum | cut -d' ' -f1; }
here="target/dist/$name.tar.gz"
there="$work/xcloak/target/dist/$name.tar.gz"
printf '%-9s %-64s %s\n' "" "libxcloak.so" "tarball"
printf '%-9s %-64s %s\n' "here" "$(so_hash "$here")" "$(sha256sum < "$here" | cut -d' ' -f1)"
printf '%-9s %-64s %s\n' "clone" "$(so_hash "$there")" "$(sha256sum < "$there" | cut -d' ' -f1)"
if ! cmp -s "$here" "$there"; then
    [ "$(so_hash "$here")" = "$(so_hash "$there")" ] && say "FAILED: same libxcloak.so, different tarballs" \
        || say "FAILED: libxcloak.so differs"
    exit 1
fi
say "ok: identical bytes"
