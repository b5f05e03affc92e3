#!/usr/bin/env bash
# Download the wheels a GPU device machine (Python 3.12, no internet) needs to
# run pyrt's GPU tests, split into two <= 64 MiB carry sets: .whl/a and .whl/b.
# See docs/hardware.md for how they are carried and installed.
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
rm -rf .whl && mkdir -p .whl/dl .whl/a .whl/b
plat=()
for n in 28 27 17; do plat+=(--platform "manylinux_2_${n}_x86_64"); done
plat+=(--platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  "${plat[@]}" -d .whl/dl \
  cuda-python cuda-bindings cuda-pathfinder tensorrt-rtx-cu13 tensorrt-rtx-cu13-bindings \
  tensorrt-rtx-cu13-libs hypothesis pytest-timeout sortedcontainers
for f in .whl/dl/*.whl; do
  size=$(stat -c %s "$f")
  if [ "$size" -gt $((60 * 1024 * 1024)) ]; then
    split -b 60M -d "$f" ".whl/b/$(basename "$f").part"   # rejoin with cat on the device
  else
    mv "$f" .whl/a/
  fi
done
du -sh .whl/a .whl/b
