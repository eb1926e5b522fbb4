#!/usr/bin/env bash
# Configures (once) and builds VAMP. Usage: scripts/build.sh [--preset NAME] [TARGET...]
# Builds hold a lock (/tmp/vamp-build.lock) so that concurrent builds on a small machine run one
# after another instead of fighting over its cores.
set -euo pipefail
cd "$(dirname "$0")/.."
preset=release
if [[ ${1:-} == --preset ]]; then preset=$2; shift 2; fi
jobs=${VAMP_BUILD_JOBS:-$(nproc)}
# ccache (when CMake found it): hash paths relative to this checkout so worktrees share objects.
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$PWD}
export CCACHE_NOHASHDIR=${CCACHE_NOHASHDIR:-true}
export CCACHE_MAXSIZE=${CCACHE_MAXSIZE:-5G}
exec 9>/tmp/vamp-build.lock
flock 9
if [[ ! -f build/$preset/build.ninja ]]; then
  cmake --preset "$preset" >/dev/null
fi
if (($# > 0)); then
  cmake --build "build/$preset" -j "$jobs" --target "$@"
else
  cmake --build "build/$preset" -j "$jobs"
fi
