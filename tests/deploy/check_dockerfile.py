#!/usr/bin/env python3
"""Structural check of deploy/container/Dockerfile*, standing in for hadolint (not packaged in
Debian 12) where no image can be pulled or built.

Usage: check_dockerfile.py SOURCE_DIR

Per Dockerfile: parses the instructions (line continuations, comments) and checks
  * it is multi-stage: a named build stage and a final runtime stage; the CUDA file builds FROM a
    nvidia/cuda *-devel-* image and runs FROM the matching *-runtime-* image, the CPU file uses
    Debian 12 (debian:12 / bookworm) for both;
  * every FROM names a tag, never :latest (hadolint DL3006, DL3007); ARGs used in FROM are
    declared before the first FROM;
  * COPY --from names an earlier stage; COPY sources from the context exist in the repository;
    ADD is not used (DL3020);
  * apt-get install uses -y and --no-install-recommends and the same RUN removes
    /var/lib/apt/lists (DL3015, DL3009); RUN with a pipe runs under SHELL -o pipefail (DL4006);
  * the runtime stage switches to a non-root USER (DL3002), copies the binaries to /opt/vamp,
    and ENTRYPOINT/CMD use the JSON form (DL3025);
  * no ENV or ARG carries a secret (token, key, password).
"""
import json
import os
import re
import sys

problems = []


def parse(path):
    instructions = []
    current = ""
    for raw in open(path):
        line = raw.rstrip("\n")
        if not current and (line.strip().startswith("#") or not line.strip()):
            continue
        if line.strip().startswith("#"):
            continue  # comment inside a continuation
        if line.endswith("\\"):
            current += line[:-1] + " "
            continue
        current += line
        word, _, rest = current.strip().partition(" ")
        instructions.append((word.upper(), rest.strip()))
        current = ""
    return instructions


def check(src, name, cuda):
    path = os.path.join(src, "deploy/container", name)
    where = f"deploy/container/{name}"
    if not os.path.exists(path):
        problems.append(f"{where}: missing")
        return
    ins = parse(path)
    global_args = {}
    stages = []  # (name, image)
    stage_ins = []
    pipefail = False
    for word, rest in ins:
        if word == "ARG" and not stages:
            k, _, v = rest.partition("=")
            global_args[k] = v
            continue
        if word == "FROM":
            m = re.match(r"(\S+)(?:\s+AS\s+(\S+))?$", rest, re.I)
            image, stage = m.group(1), m.group(2)
            for var in re.findall(r"\$\{(\w+)\}", image):
                if var not in global_args:
                    problems.append(f"{where}: FROM uses ${{{var}}} without a global ARG")
                image = image.replace("${" + var + "}", global_args.get(var, ""))
            if ":" not in image.split("/")[-1] or image.endswith(":latest"):
                problems.append(f"{where}: FROM {image}: pin a tag other than latest")
            stages.append((stage, image))
            stage_ins.append([])
            pipefail = False
            continue
        if not stages:
            problems.append(f"{where}: {word} before the first FROM")
            continue
        stage_ins[-1].append((word, rest))
        if word == "SHELL":
            pipefail = "pipefail" in rest
        if word == "ADD":
            problems.append(f"{where}: use COPY, not ADD: ADD {rest}")
        if word == "COPY":
            parts = rest.split()
            flags = [p for p in parts if p.startswith("--")]
            paths = [p for p in parts if not p.startswith("--")]
            sources = paths[:-1]
            from_stage = [f.split("=", 1)[1] for f in flags if f.startswith("--from=")]
            if from_stage:
                if from_stage[0] not in [s for s, _ in stages[:-1]]:
                    problems.append(f"{where}: COPY --from={from_stage[0]} is not an earlier stage")
            else:
                for s in sources:
                    if s != "." and not os.path.exists(os.path.join(src, s)):
                        problems.append(f"{where}: COPY source {s} does not exist")
        if word == "RUN":
            if "apt-get install" in rest:
                for flag in ("-y", "--no-install-recommends"):
                    if not re.search(rf"(^|\s){re.escape(flag)}(\s|$)", rest):
                        problems.append(f"{where}: apt-get install without {flag}")
                if "rm -rf /var/lib/apt/lists" not in rest:
                    problems.append(f"{where}: apt-get install without removing /var/lib/apt/lists")
            if re.search(r"[^|]\|[^|]", rest) and not pipefail:
                problems.append(f"{where}: RUN with a pipe needs SHELL [..., \"-o\", \"pipefail\", ...]")
        if word in ("ENV", "ARG") and re.search(r"(?i)(token|passw|secret|api_?key)", rest):
            problems.append(f"{where}: {word} {rest}: no secrets in images")
    if len(stages) < 2:
        problems.append(f"{where}: want a multi-stage build, got {len(stages)} stage(s)")
        return
    (build_name, build_image), (_, run_image) = stages[0], stages[-1]
    if not build_name:
        problems.append(f"{where}: the build stage has no name")
    if cuda:
        if not re.match(r"nvidia/cuda:[\d.]+-devel-", build_image):
            problems.append(f"{where}: build FROM {build_image}, want a nvidia/cuda devel image")
        if not re.match(r"nvidia/cuda:[\d.]+-runtime-", run_image):
            problems.append(f"{where}: run FROM {run_image}, want a nvidia/cuda runtime image")
        if build_image.split("-devel-") != run_image.split("-runtime-"):
            problems.append(f"{where}: devel {build_image} and runtime {run_image} differ")
    else:
        for image in (build_image, run_image):
            if not re.match(r"debian:(12|bookworm)", image):
                problems.append(f"{where}: FROM {image}, want Debian 12")
    final = stage_ins[-1]
    users = [rest for word, rest in final if word == "USER"]
    if not users or users[-1].split(":")[0] in ("root", "0"):
        problems.append(f"{where}: the runtime stage must end as a non-root USER")
    if not any(w == "COPY" and "--from=" in r and "/opt/vamp" in r for w, r in final):
        problems.append(f"{where}: the runtime stage must copy the bundle to /opt/vamp")
    for word in ("ENTRYPOINT", "CMD"):
        for w, r in final:
            if w == word:
                try:
                    if not isinstance(json.loads(r), list):
                        raise ValueError
                except ValueError:
                    problems.append(f"{where}: {word} {r}: use the JSON (exec) form")
    if not any(w == "ENTRYPOINT" for w, _ in final):
        problems.append(f"{where}: no ENTRYPOINT")
    ignore = path + ".dockerignore"
    if not os.path.exists(ignore) or "build/" not in open(ignore).read():
        problems.append(f"{where}: {name}.dockerignore must keep build/ out of the context")


def main():
    src = sys.argv[1]
    check(src, "Dockerfile", cuda=True)
    check(src, "Dockerfile.cpu", cuda=False)
    if problems:
        print("check_dockerfile:\n  " + "\n  ".join(problems), file=sys.stderr)
        return 1
    print("check_dockerfile: Dockerfile and Dockerfile.cpu pass")
    return 0


if __name__ == "__main__":
    sys.exit(main())
