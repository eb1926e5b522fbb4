#!/usr/bin/env python3
"""Builds every kustomization in deploy/k8s with `kubectl kustomize` and checks the output.

Usage: check_k8s.py SOURCE_DIR [KUBECTL]

The overlays expect secrets/agent-token and secrets/api-keys next to their kustomization (never
committed), so the tree is copied to a temporary folder and throwaway secrets are written there.
Structural checks on each build:
  * every object has apiVersion, kind, metadata.name; names are unique per kind;
  * workloads (Deployment, StatefulSet, LeaderWorkerSet templates): selector.matchLabels match the
    pod template's labels; every container has an image, resource requests (cpu, memory) and
    liveness and readiness probes whose ports are container ports; no secret on a command line;
    pods run as non-root;
  * agents (component=agent) request and limit exactly one nvidia.com/gpu; the controller none;
  * Services, the PodDisruptionBudget and the Pod/ServiceMonitors select existing pods (or
    Services) and name ports those expose; a StatefulSet's serviceName is a headless Service;
  * ConfigMaps and Secrets that pods mount exist in the build; the Secret holds agent-token and
    api-keys;
  * "world_size" in the generated controller.json equals the agent count, and the Service the
    agents register through (agent.json "controller") exists, has that port and publishes
    not-ready addresses.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

import yaml

problems = []


def problem(where, message):
    problems.append(f"{where}: {message}")


def subset(small, big):
    return all(big.get(k) == v for k, v in (small or {}).items())


def pod_templates(doc):
    """(name, component, template, replicas) of a workload's pod templates."""
    kind = doc["kind"]
    spec = doc.get("spec", {})
    if kind in ("Deployment", "StatefulSet"):
        yield doc["metadata"]["name"], spec["template"], spec.get("replicas", 1), spec.get("selector")
    elif kind == "LeaderWorkerSet":
        lwt = spec["leaderWorkerTemplate"]
        size = lwt.get("size", 1)
        groups = spec.get("replicas", 1)
        if "leaderTemplate" in lwt:
            yield doc["metadata"]["name"] + "/leader", lwt["leaderTemplate"], groups, None
            yield doc["metadata"]["name"] + "/worker", lwt["workerTemplate"], groups * (size - 1), None
        else:
            yield doc["metadata"]["name"] + "/worker", lwt["workerTemplate"], groups * size, None


def check_build(name, docs):
    by_kind = {}
    for d in docs:
        for key in ("apiVersion", "kind"):
            if not d.get(key):
                problem(name, f"object without {key}: {d.get('metadata')}")
        meta = d.get("metadata") or {}
        if not meta.get("name"):
            problem(name, f"{d.get('kind')} without metadata.name")
            continue
        names = by_kind.setdefault(d["kind"], {})
        if meta["name"] in names:
            problem(name, f"two {d['kind']} objects named {meta['name']}")
        names[meta["name"]] = d

    pods = []  # (where, labels, template spec, replicas)
    for d in docs:
        if d["kind"] not in ("Deployment", "StatefulSet", "LeaderWorkerSet"):
            continue
        for where, template, replicas, selector in pod_templates(d):
            where = f"{name}: {d['kind']} {where}"
            labels = template.get("metadata", {}).get("labels", {})
            if d["kind"] != "LeaderWorkerSet":
                if not selector or not selector.get("matchLabels"):
                    problem(where, "no selector.matchLabels")
                elif not subset(selector["matchLabels"], labels):
                    problem(where, f"selector {selector['matchLabels']} does not match the "
                                   f"template labels {labels}")
            spec = template["spec"]
            pods.append((where, labels, spec, replicas))
            sc = spec.get("securityContext", {})
            if not sc.get("runAsNonRoot"):
                problem(where, "pods must set securityContext.runAsNonRoot")
            component = labels.get("app.kubernetes.io/component")
            if component not in ("controller", "agent"):
                problem(where, f"app.kubernetes.io/component is {component!r}")
            for c in spec.get("containers", []):
                cw = f"{where} container {c.get('name')}"
                if not c.get("image"):
                    problem(cw, "no image")
                res = c.get("resources", {})
                for r in ("cpu", "memory"):
                    if r not in res.get("requests", {}):
                        problem(cw, f"no {r} request")
                ports = {p["containerPort"]: p.get("name") for p in c.get("ports", [])}
                for probe in ("livenessProbe", "readinessProbe"):
                    p = c.get(probe)
                    if not p:
                        problem(cw, f"no {probe}")
                        continue
                    handler = p.get("grpc") or p.get("httpGet") or p.get("tcpSocket")
                    if handler is None:
                        problem(cw, f"{probe} is neither grpc, httpGet nor tcpSocket")
                    elif handler.get("port") not in ports and handler.get("port") not in ports.values():
                        problem(cw, f"{probe} port {handler.get('port')} is not a container port")
                if component == "controller" and c["readinessProbe"].get("grpc", {}).get("service") != "vamp.v1.Serving":
                    problem(cw, "readiness must be gRPC health of vamp.v1.Serving")
                gpu_req = res.get("requests", {}).get("nvidia.com/gpu")
                gpu_lim = res.get("limits", {}).get("nvidia.com/gpu")
                if component == "agent" and (str(gpu_lim) != "1" or gpu_req not in (None, 1, "1")):
                    problem(cw, f"an agent needs exactly one nvidia.com/gpu (limit {gpu_lim}, "
                                f"request {gpu_req})")
                if component == "controller" and (gpu_lim or gpu_req):
                    problem(cw, "the controller must not request a GPU")
                args = " ".join(c.get("command", []) + c.get("args", []))
                for flag in ("--auth_token=", "--api_key=", "--token="):
                    if flag in args:
                        problem(cw, f"secret on the command line ({flag})")
                if component and "--auth_token_file=" not in args:
                    problem(cw, "no --auth_token_file (the agents' shared secret)")
                mounts = {m["name"] for m in c.get("volumeMounts", [])}
                volumes = {v["name"] for v in spec.get("volumes", [])}
                for m in mounts - volumes:
                    problem(cw, f"mounts volume {m} that the pod does not define")
            for v in spec.get("volumes", []):
                if "configMap" in v and v["configMap"]["name"] not in by_kind.get("ConfigMap", {}):
                    problem(where, f"ConfigMap {v['configMap']['name']} is not in the build")
                if "secret" in v and v["secret"]["secretName"] not in by_kind.get("Secret", {}):
                    problem(where, f"Secret {v['secret']['secretName']} is not in the build")
        if d["kind"] == "StatefulSet":
            svc = by_kind.get("Service", {}).get(d["spec"].get("serviceName"))
            if svc is None or svc["spec"].get("clusterIP") != "None":
                problem(name, f"StatefulSet {d['metadata']['name']}: serviceName "
                              f"{d['spec'].get('serviceName')} is not a headless Service")

    def pods_matching(selector):
        return [p for p in pods if subset(selector, p[1])]

    for svc in by_kind.get("Service", {}).values():
        where = f"{name}: Service {svc['metadata']['name']}"
        matched = pods_matching(svc["spec"].get("selector"))
        if not svc["spec"].get("selector") or not matched:
            problem(where, "selects no pod")
            continue
        names = {p.get("name") for m in matched for c in m[2]["containers"] for p in c.get("ports", [])}
        for port in svc["spec"].get("ports", []):
            if isinstance(port.get("targetPort"), str) and port["targetPort"] not in names:
                problem(where, f"targetPort {port['targetPort']} is not a port of its pods")
    for pdb in by_kind.get("PodDisruptionBudget", {}).values():
        if not pods_matching(pdb["spec"]["selector"]["matchLabels"]):
            problem(f"{name}: PodDisruptionBudget {pdb['metadata']['name']}", "selects no pod")
    for pm in by_kind.get("PodMonitor", {}).values():
        matched = pods_matching(pm["spec"]["selector"]["matchLabels"])
        where = f"{name}: PodMonitor {pm['metadata']['name']}"
        if not matched:
            problem(where, "selects no pod")
        names = {p.get("name") for m in matched for c in m[2]["containers"] for p in c.get("ports", [])}
        for ep in pm["spec"]["podMetricsEndpoints"]:
            if ep.get("port") not in names:
                problem(where, f"port {ep.get('port')} is not a port of the selected pods")
    for sm in by_kind.get("ServiceMonitor", {}).values():
        where = f"{name}: ServiceMonitor {sm['metadata']['name']}"
        services = [s for s in by_kind.get("Service", {}).values()
                    if subset(sm["spec"]["selector"]["matchLabels"], s["metadata"].get("labels", {}))]
        if not services:
            problem(where, "selects no Service")
        names = {p.get("name") for s in services for p in s["spec"]["ports"]}
        for ep in sm["spec"]["endpoints"]:
            if ep.get("port") not in names:
                problem(where, f"port {ep.get('port')} is not a port of the selected Services")

    secrets = by_kind.get("Secret", {})
    for s in secrets.values():
        keys = set(s.get("data", {})) | set(s.get("stringData", {}))
        if not {"agent-token", "api-keys"} <= keys:
            problem(f"{name}: Secret {s['metadata']['name']}", f"holds {sorted(keys)}, "
                    "want agent-token and api-keys")
    configs = [c for c in by_kind.get("ConfigMap", {}).values() if "controller.json" in c.get("data", {})]
    # Agents register before the controller is ready: the Service they dial must publish
    # not-ready addresses and expose the port they dial.
    for c in configs:
        controller = json.loads(c["data"].get("agent.json", "{}")).get("controller")
        if not controller:
            continue
        host, _, port = controller.rpartition(":")
        svc = by_kind.get("Service", {}).get(host.split(".")[0])
        if svc is None:
            problem(name, f"agents register with {controller}: no Service {host.split('.')[0]}")
        elif not svc["spec"].get("publishNotReadyAddresses"):
            problem(name, f"Service {svc['metadata']['name']} (agent registration) must publish "
                          "not-ready addresses: the controller turns ready only after agents register")
        elif int(port) not in [p["port"] for p in svc["spec"]["ports"]]:
            problem(name, f"Service {svc['metadata']['name']} has no port {port}")
    agents = sum(p[3] for p in pods if p[1].get("app.kubernetes.io/component") == "agent")
    controllers = sum(p[3] for p in pods if p[1].get("app.kubernetes.io/component") == "controller")
    if configs and controllers:
        world = json.loads(configs[0]["data"]["controller.json"]).get("world_size", 1)
        if agents != world * controllers:
            problem(name, f"{agents} agents for {controllers} controller(s) of world_size {world}")
    return by_kind


def main():
    src = sys.argv[1]
    kubectl = sys.argv[2] if len(sys.argv) > 2 else "kubectl"
    if shutil.which(kubectl) is None:
        print(f"check_k8s: '{kubectl}' is missing (scripts/install-deps.sh installs "
              "kubernetes-client)", file=sys.stderr)
        return 1
    tmp = tempfile.mkdtemp(prefix="vamp-k8s-")
    try:
        root = os.path.join(tmp, "k8s")
        shutil.copytree(os.path.join(src, "deploy/k8s"), root)
        overlays = sorted(os.listdir(os.path.join(root, "overlays")))
        for o in overlays:
            os.makedirs(os.path.join(root, "overlays", o, "secrets"), exist_ok=True)
            for f in ("agent-token", "api-keys"):
                with open(os.path.join(root, "overlays", o, "secrets", f), "w") as out:
                    out.write(f"throwaway-{f}\n")
        expected = {"single-node", "multi-node", "multi-node-lws"}
        if not expected <= set(overlays):
            problem("deploy/k8s/overlays", f"has {overlays}, want {sorted(expected)}")
        built = {}
        for o in overlays:
            run = subprocess.run([kubectl, "kustomize", os.path.join(root, "overlays", o)],
                                 capture_output=True, text=True, timeout=120)
            if run.returncode != 0:
                problem(f"overlay {o}", f"kubectl kustomize failed: {run.stderr.strip()}")
                continue
            docs = [d for d in yaml.safe_load_all(run.stdout) if d]
            built[o] = check_build(f"overlay {o}", docs)
        kinds = {k for b in built.values() for k in b}
        for k in ("Deployment", "StatefulSet", "LeaderWorkerSet", "Service", "ConfigMap", "Secret",
                  "PodDisruptionBudget", "PodMonitor", "ServiceMonitor", "PrometheusRule"):
            if k not in kinds:
                problem("deploy/k8s", f"no overlay builds a {k}")
        if problems:
            print("check_k8s:\n  " + "\n  ".join(problems), file=sys.stderr)
            return 1
        version = subprocess.run([kubectl, "version", "--client"], capture_output=True,
                                 text=True).stdout.splitlines()[0:1]
        print(f"check_k8s: {len(built)} overlays built and checked ({' '.join(version)})")
        return 0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
