#!/usr/bin/env bash
# Makes a portable bundle of VAMP binaries: bin/ holds the executables, lib/ the Debian shared
# libraries they need (gRPC, protobuf, Abseil, prometheus-cpp, ...), and every binary's RPATH is
# $ORIGIN/../lib, so the bundle runs on a machine without those packages (the GPU host). The C
# runtime, the dynamic loader and CUDA's libraries are left out: the target provides them.
#
# Usage: deploy/bundle/make_bundle.sh [--build DIR] [--out DIR] [--tar FILE] [--strip] [BINARY...]
#   BINARY paths are relative to the build folder; default: every executable in it.
#   --strip: strip the executables' symbol tables (strip --strip-unneeded): the device tool
#   carries at most 64 MiB, and a bundle of every CUDA test binary fits only stripped.
set -euo pipefail
build=build/release
out=.bundle
tarball=""
strip_binaries=0
while (($#)); do
  case "$1" in
    --build) build=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --tar) tarball=$2; shift 2 ;;
    --strip) strip_binaries=1; shift ;;
    -h|--help) sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    --*) echo "make_bundle: unknown option '$1'" >&2; exit 2 ;;
    *) break ;;
  esac
done
command -v patchelf >/dev/null || { echo "make_bundle: patchelf is missing (scripts/install-deps.sh)" >&2; exit 1; }
[[ -d $build ]] || { echo "make_bundle: build folder '$build' does not exist" >&2; exit 1; }

binaries=()
if (($#)); then
  for b in "$@"; do
    [[ -x $build/$b ]] || { echo "make_bundle: '$build/$b' is not an executable" >&2; exit 1; }
    binaries+=("$build/$b")
  done
else
  while IFS= read -r f; do binaries+=("$f"); done < <(
    find "$build" -type f -perm -u+x ! -name '*.so*' ! -path '*/CMakeFiles/*' \
      -exec sh -c 'head -c4 "$1" | grep -q ELF' _ {} \; -print | sort)
fi
((${#binaries[@]})) || { echo "make_bundle: no binaries found in '$build'" >&2; exit 1; }

rm -rf "$out"
mkdir -p "$out/bin" "$out/lib"
# Libraries the target machine provides: glibc's, the loader, the GCC runtime, CUDA's and the
# driver's. Everything else that ldd resolves travels.
skip='^(linux-vdso|ld-linux|libc\.so|libm\.so|libdl\.so|libpthread\.so|librt\.so|libresolv\.so|libgcc_s|libcuda\.so|libcudart|libcublas|libnccl|libnvidia)'
for bin in "${binaries[@]}"; do
  cp "$bin" "$out/bin/"
  ldd "$bin" | awk '/=> \// {print $1, $3}' | while read -r name path; do
    [[ $name =~ $skip ]] && continue
    [[ -e $out/lib/$name ]] || cp -L "$path" "$out/lib/$name"
  done
done
if ((strip_binaries)); then
  command -v strip >/dev/null || { echo "make_bundle: strip is missing (binutils)" >&2; exit 1; }
  strip --strip-unneeded "$out"/bin/*
fi
for f in "$out"/bin/* "$out"/lib/*; do
  patchelf --set-rpath '$ORIGIN/../lib' --force-rpath "$f" 2>/dev/null || true
done
echo "make_bundle: ${#binaries[@]} binaries, $(ls "$out/lib" | wc -l) libraries, $(du -sh "$out" | cut -f1) in $out"
if [[ -n $tarball ]]; then
  tar -C "$(dirname "$out")" -czf "$tarball" "$(basename "$out")"
  echo "make_bundle: wrote $tarball ($(du -h "$tarball" | cut -f1))"
fi
