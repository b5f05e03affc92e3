#!/usr/bin/env bash
# Prepare .gpu/: everything scripts/gpu_check.sh needs on a GPU machine that has no
# TensorRT and no internet, in one carry of <= 64 MiB (see docs/hardware.md):
#   - TensorRT-RTX 1.7.1 for Python 3.12: libtensorrt_rtx.so.1 (234 MB, 91 MB as a wheel)
#     recompressed with xz's x86 filter and a 256 MiB dictionary (~29 MB), the ONNX
#     parser and the bindings;
#   - a small ONNX MLP and TensorRT-RTX engines built from it here, on the CPU, with
#     the default (portable) compute-capability targets.
# Run it with the project's .venv (it builds engines with tensorrt_rtx); ~6 minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
mkdir -p .git/info; for d in /.gpu/ /.gpu-cache/; do grep -qx "$d" .git/info/exclude 2>/dev/null || echo "$d" >> .git/info/exclude; done
VER=1.7.1.116
mkdir -p .gpu-cache .gpu
rm -rf .gpu/site .gpu/*.whl && mkdir -p .gpu/site
for pkg in tensorrt-rtx-cu13-bindings tensorrt-rtx-cu13-libs; do
  ls .gpu-cache/"${pkg//-/_}"-$VER-*.whl >/dev/null 2>&1 ||
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      --platform manylinux_2_28_x86_64 -d .gpu-cache "$pkg==$VER"
done
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
unzip -q -o .gpu-cache/tensorrt_rtx_cu13_libs-$VER-*.whl -d "$tmp"
cp .gpu-cache/tensorrt_rtx_cu13_bindings-$VER-*.whl .gpu/
mkdir -p .gpu/site/tensorrt_rtx_libs .gpu/site/tensorrt_rtx
cp "$tmp/tensorrt_rtx_libs/__init__.py" .gpu/site/tensorrt_rtx_libs/
printf 'from tensorrt_rtx_bindings import *\nfrom tensorrt_rtx_bindings import __version__\n' \
  > .gpu/site/tensorrt_rtx/__init__.py
for lib in libtensorrt_rtx.so.1 libtensorrt_onnxparser_rtx.so.1; do
  if [ ! -s ".gpu/$lib.xz" ]; then
    xz -T1 --x86 --lzma2=preset=9e,dict=256MiB -c "$tmp/tensorrt_rtx_libs/$lib" > ".gpu/$lib.xz.part"
    mv ".gpu/$lib.xz.part" ".gpu/$lib.xz"
  fi
done
"$PY" scripts/gpu_check.py prepare --assets .gpu
du -sh .gpu; du -sb .gpu/*.xz .gpu/*.whl .gpu/site .gpu/assets
