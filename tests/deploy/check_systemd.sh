#!/usr/bin/env bash
# Checks deploy/systemd: `systemd-analyze verify` on the units, and the properties a
# production deployment needs of them. Usage: check_systemd.sh SOURCE_DIR VAMP_CONTROLLER VAMP_AGENT
#
# The verify form works in a container where systemd is not running (no PID 1 manager, no bus):
# `systemd-analyze verify` loads unit files offline. Two details make it meaningful there:
#   * verify fails when an ExecStart= binary is missing, so the units are copied to a temporary
#     folder with /opt/vamp/bin/... replaced by the binaries just built;
#   * units are passed as paths (./vamp-agent@0.service): a bare name is looked up in the system
#     unit path, not found, and silently passes. Unknown keys and bad specifiers are warnings with
#     exit status 0, so any output at all counts as a failure.
# A self-test first feeds a unit with a bogus key through the same form and expects a failure.
set -euo pipefail
src=$1 controller=$2 agent=$3
command -v systemd-analyze >/dev/null ||
  { echo "check_systemd: systemd-analyze is missing (scripts/install-deps.sh installs systemd)" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cp "$src"/deploy/systemd/vamp-controller.service "$src"/deploy/systemd/vamp-agent@.service \
  "$src"/deploy/systemd/vamp.target "$tmp/"
sed -i "s|/opt/vamp/bin/vamp-controller|$controller|; s|/opt/vamp/bin/vamp-agent|$agent|" \
  "$tmp"/*.service

verify() {  # verify DIR UNIT_PATH...: fails on a non-zero status or any output
  local dir=$1 out
  shift
  if ! out=$(cd "$dir" && SYSTEMD_LOG_LEVEL=notice systemd-analyze verify --man=no \
               --generators=no "$@" 2>&1) || [[ -n $out ]]; then
    echo "$out"
    return 1
  fi
}

# Self-test: the form must catch a broken unit in this environment.
mkdir "$tmp/selftest"
sed 's/^WatchdogSec=60$/WatchdogSec=60\nNoSuchKey=1/' "$tmp/vamp-agent@.service" \
  > "$tmp/selftest/vamp-agent@.service"
if verify "$tmp/selftest" ./vamp-agent@0.service >/dev/null 2>&1; then
  echo "check_systemd: systemd-analyze verify did not report a bogus key: the check is blind here" >&2
  exit 1
fi
rm -rf "$tmp/selftest"

verify "$tmp" ./vamp-controller.service ./vamp-agent@0.service ./vamp-agent@7.service ./vamp.target ||
  { echo "check_systemd: systemd-analyze verify failed (above)" >&2; exit 1; }

# What the issue asks of the units, checked on the installed (unsubstituted) files.
python3 - "$src/deploy/systemd" <<'PY'
import re, sys, os
d = sys.argv[1]
problems = []

def load(name):
    text = open(os.path.join(d, name)).read()
    keys = {}
    for line in text.splitlines():
        m = re.match(r"^([A-Za-z]+)=(.*)$", line)
        if m:
            keys.setdefault(m.group(1), []).append(m.group(2))
    return text, keys

def need(name, keys, key, pattern=None):
    values = keys.get(key, [])
    if not values or (pattern and not any(re.search(pattern, v) for v in values)):
        problems.append(f"{name}: needs {key}=" + (pattern or "..."))

for name in ("vamp-controller.service", "vamp-agent@.service"):
    text, keys = load(name)
    need(name, keys, "Type", "^notify$")
    need(name, keys, "WatchdogSec")
    need(name, keys, "Restart", "^on-failure$")
    need(name, keys, "EnvironmentFile")
    need(name, keys, "ExecStart", r"--config \$\{VAMP_")
    need(name, keys, "LoadCredential", r"^agent-token:")
    need(name, keys, "ExecStart", r"--auth_token_file %d/agent-token")
    need(name, keys, "PartOf", "vamp.target")
    need(name, keys, "NoNewPrivileges", "yes")
    need(name, keys, "ProtectSystem", "strict")
    need(name, keys, "User")
    exec_line = keys.get("ExecStart", [""])[0]
    if re.search(r"token(?!_file)|api[-_]key(?!_file)", exec_line.replace("agent-token", "")):
        problems.append(f"{name}: ExecStart must not carry a secret: {exec_line}")
    # Every relaxed hardening option is explained by the comment block right above it.
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if re.match(r"^(PrivateDevices=no|MemoryDenyWriteExecute=no|LimitMEMLOCK=)", line):
            j = i - 1
            comment = []
            while j >= 0 and lines[j].startswith("#"):
                comment.append(lines[j])
                j -= 1
            if not any("Relaxed" in c for c in comment):
                problems.append(f"{name}: '{line}' is relaxed without a 'Relaxed...' comment")
_, agent = load("vamp-agent@.service")
need("vamp-agent@.service", agent, "Environment", r"^CUDA_VISIBLE_DEVICES=%i$")
need("vamp-agent@.service", agent, "DevicePolicy", "^closed$")
need("vamp-agent@.service", agent, "DeviceAllow", r"^/dev/nvidia%i rw$")
nvidia = [v for v in agent.get("DeviceAllow", []) if re.match(r"/dev/nvidia\d", v)]
if nvidia:
    problems.append(f"vamp-agent@.service: DeviceAllow names a fixed GPU: {nvidia}")
_, controller = load("vamp-controller.service")
need("vamp-controller.service", controller, "PrivateDevices", "yes")
_, target = load("vamp.target")
need("vamp.target", target, "WantedBy", "multi-user.target")
if problems:
    print("check_systemd:\n  " + "\n  ".join(problems), file=sys.stderr)
    sys.exit(1)
PY
echo "check_systemd: units verified (systemd $(systemd-analyze --version | head -1 | awk '{print $2}'))"
