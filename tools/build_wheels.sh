#!/usr/bin/env bash
# Build ql-runner's release files: the sdist, then from it one platform wheel per machine with the
# compiled launcher inside (setup.py; docs/launcher.md, "Which launcher").
#
#   tools/build_wheels.sh [--out DIR] [sdist|x86_64|aarch64 ...]     (default: all three, into dist/)
#
# Each wheel is built from the unpacked sdist, so it is what `pip install ql-runner-*.tar.gz` builds.
# The native machine's wheel uses cc (or $CC); another machine's uses Debian's cross compiler
# <machine>-linux-gnu-gcc (apt: gcc-aarch64-linux-gnu libc6-dev-arm64-cross), checked under
# qemu-<machine>-static when that is installed. QL_LAUNCHER_BUILD=require: a wheel that would come
# out without its launcher fails the build instead. Needs `build` (pip install build) in $PYTHON.
set -euo pipefail
cd "$(dirname "$0")/.."
out=dist
targets=()
while [ $# -gt 0 ]; do
  case $1 in
    --out) out=$2; shift 2 ;;
    --out=*) out=${1#--out=}; shift ;;
    sdist|x86_64|aarch64) targets+=("$1"); shift ;;
    -h|--help) sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "build_wheels.sh: unknown argument $1 (targets: sdist, x86_64, aarch64)" >&2; exit 2 ;;
  esac
done
[ ${#targets[@]} -gt 0 ] || targets=(sdist x86_64 aarch64)
python=${PYTHON:-python3}
"$python" -c 'import build' 2>/dev/null || { echo "build_wheels.sh: $python has no 'build' module: pip install build" >&2; exit 2; }
mkdir -p "$out"
out=$(cd "$out" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# One sdist build at a time per source tree: setuptools assembles it in ./ql_runner-<version>/ and
# removes that when done, so a second build running at once (two test workers) loses its files.
mkdir -p build
if command -v flock >/dev/null 2>&1; then exec 9>build/.sdist.lock && flock 9; fi
"$python" -m build --sdist --outdir "$work/sdist" . >"$work/sdist.log" 2>&1 \
  || { cat "$work/sdist.log" >&2; echo "build_wheels.sh: the sdist did not build" >&2; exit 1; }
exec 9>&-
sdist=$(ls "$work"/sdist/ql_runner-*.tar.gz)
native=$(uname -m)
for target in "${targets[@]}"; do
  if [ "$target" = sdist ]; then
    cp "$sdist" "$out/" && echo "$out/$(basename "$sdist")"
    continue
  fi
  if [ "$target" = "$native" ]; then
    cc=${CC:-cc}
  else
    cc=$target-linux-gnu-gcc
  fi
  command -v "$cc" >/dev/null || { echo "build_wheels.sh: no $cc for the $target wheel (Debian: apt-get install" \
    "gcc-${target//_/-}-linux-gnu libc6-dev-$( [ "$target" = aarch64 ] && echo arm64 || echo amd64 )-cross)" >&2; exit 1; }
  src=$work/src-$target
  mkdir -p "$src" && tar -xzf "$sdist" -C "$src" --strip-components=1
  QL_LAUNCHER_CC=$cc QL_LAUNCHER_BUILD=require "$python" -m build --wheel --outdir "$work/$target" "$src" \
    >"$work/$target.log" 2>&1 || { cat "$work/$target.log" >&2; echo "build_wheels.sh: the $target wheel did not build" >&2; exit 1; }
  grep '^ql-runner build:' "$work/$target.log" >&2 || true
  wheel=$(ls "$work/$target"/ql_runner-*.whl)
  # What pip will see: the tag, and the launcher with its execute bit.
  "$python" - "$wheel" "$target" <<'PY'
import sys, zipfile
wheel, machine = sys.argv[1], sys.argv[2]
name = f"ql_executors/local_process/bin/launcher-{machine}"
with zipfile.ZipFile(wheel) as z:
    info = z.getinfo(name)
    assert info.external_attr >> 16 & 0o111, f"{name} is not executable in {wheel}"
    assert "ql_executors/local_process/bin/launcher.json" in z.namelist()
assert wheel.endswith(f"-py3-none-manylinux_2_17_{machine}.manylinux2014_{machine}.musllinux_1_1_{machine}.whl"), wheel
PY
  cp "$wheel" "$out/" && echo "$out/$(basename "$wheel")"
done
