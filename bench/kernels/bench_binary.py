"""Runs a VAMP kernel benchmark binary and reads its JSON lines, shared by the Python drivers."""
import json
import os
import subprocess
import sys


def run_json_lines(cmd, timeout, echo=sys.stderr):
    """Runs `cmd`; returns (records, errors).

    records: every line of its stdout that is a JSON object, in order (each echoed to `echo`);
    errors: what went wrong, as sentences: the binary failed to start or timed out, a line looked
    like JSON but did not parse, or it exited non-zero (with the end of its stderr). Records that
    report an error of their own are returned as they are; the caller names them.
    """
    name = os.path.basename(cmd[0])
    print("running:", " ".join(cmd), file=sys.stderr)
    records, errors = [], []
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as e:
        errors.append(f"{name} failed to run: {e}")
        return records, errors
    for line in proc.stdout.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            errors.append(f"unparsable line: {line}")
            continue
        print(line, file=echo)
    if proc.returncode != 0:
        errors.append(f"{name} exited {proc.returncode}: {proc.stderr.strip()[-2000:]}")
    return records, errors
