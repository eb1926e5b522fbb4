#!/usr/bin/env python3
"""Runs every dashboard and rule query against real data.

Starts vamp-controller with one spawned CPU agent on the tiny model (loopback, free ports, JSON
logs to a file, an auth token, a fake systemd notification socket), sends requests and an expert
offload/restore, and starts a real Prometheus (the Debian package) with scripts/observe.sh: it finds
the controller and its agent through the controller's /metrics/targets (HTTP service discovery)
and loads the rules.
Then checks that:
  * every vamp_* metric a dashboard or rule names is exported by the processes (# TYPE lines of a
    live scrape), every vamp:* name is recorded by a rule, and nothing else is queried but `up`;
  * every dashboard query is accepted by Prometheus' query API and returns data, except queries
    over metrics that legitimately have no samples yet (declared in # HELP/# TYPE without a sample
    line, or, for the labelled families in NO_SERIES_YET that prometheus-cpp leaves out of the
    exposition until their first series, registered in the C++ source);
  * the dashboard variables' label_values queries find the replica and rank labels;
  * every recording and alerting rule expression is accepted by the query API;
  * the logs are JSON lines, carry one line per finished request, and never the token;
  * the controller sent READY=1 (once: the agent must not), WATCHDOG=1 and STOPPING=1.
Usage: live_scrape_test.py SOURCE_DIR CONTROLLER AGENT VAMPCTL
"""
import glob
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

import yaml

DEADLINE_S = 240
TOKEN = "live-scrape-test-token-3f9c2a"


def fail(message):
    raise AssertionError(message)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(url, timeout=5):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode()


def http_post_json(url, body, timeout=60):
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read().decode())


def wait_for(what, predicate, timeout, interval=0.2):
    end = time.time() + timeout
    last_error = None
    while time.time() < end:
        try:
            value = predicate()
            if value:
                return value
        except (OSError, ValueError, urllib.error.URLError) as e:
            last_error = e
        time.sleep(interval)
    fail(f"timed out after {timeout} s waiting for {what} (last error: {last_error})")


def exported_families(text):
    """{name: (type, has_samples)} from a Prometheus text exposition."""
    families = {}
    for line in text.splitlines():
        m = re.match(r"# TYPE (\S+) (\S+)", line)
        if m:
            families[m.group(1)] = [m.group(2), False]
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name = re.match(r"[a-zA-Z_:][a-zA-Z0-9_:]*", line).group(0)
        for suffix in ("", "_bucket", "_sum", "_count"):
            base = name[: len(name) - len(suffix)] if suffix and name.endswith(suffix) else name
            if base in families:
                families[base][1] = True
                break
    return families


LABELS = {"vamp_role"}  # label names that share the vamp_ prefix

# Families whose every series carries a label value that appears only once something happens:
# prometheus-cpp leaves a family without series out of the exposition entirely (no # HELP/# TYPE),
# so for these the registration in the C++ source stands in for the scrape. Keep this short.
NO_SERIES_YET = {
    # {action} is the arbiter's choice; the tiny model's requests never run out of KV blocks.
    "vamp_arbiter_decisions_total": "controller/serving/serving_engine.cc",
}


def metric_names(expr):
    """vamp_* and vamp:* metric names an expression selects."""
    names = set(re.findall(r"\bvamp[_:][a-zA-Z0-9_:]+", expr)) - LABELS
    return names


def family_of(name, families):
    if name in families:
        return name
    for suffix in ("_bucket", "_sum", "_count"):
        if name.endswith(suffix) and families.get(name[: -len(suffix)], [""])[0] == "histogram":
            return name[: -len(suffix)]
    return None


def expand(expr):
    return (expr.replace("$replica", ".*").replace("$rank", ".*")
            .replace("$__rate_interval", "1m").replace("${datasource}", ""))


def main():
    src, controller, agent, vampctl = sys.argv[1:5]
    for tool in ("prometheus",):
        if shutil.which(tool) is None:
            fail(f"'{tool}' is not installed (scripts/install-deps.sh installs the Debian package)")
    started = time.time()
    tmp = tempfile.mkdtemp(prefix="vamp-live-scrape-")
    procs = []
    notify = None
    try:
        token_file = os.path.join(tmp, "token")
        with open(token_file, "w") as f:
            f.write(TOKEN + "\n")
        log_file = os.path.join(tmp, "vamp.log")
        ready_file = os.path.join(tmp, "ready.json")
        notify_path = os.path.join(tmp, "notify")
        notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        notify.bind(notify_path)
        notify.settimeout(0.1)
        # Read notifications as they come, as systemd does (the socket queue holds only a few).
        messages = []

        def read_notifications():
            while notify is not None and notify.fileno() >= 0:
                try:
                    messages.append(notify.recv(4096).decode())
                except socket.timeout:
                    continue
                except OSError:
                    return

        reader = threading.Thread(target=read_notifications, daemon=True)
        reader.start()
        env = dict(os.environ, NOTIFY_SOCKET=notify_path, WATCHDOG_USEC="1000000")
        env.pop("WATCHDOG_PID", None)
        cmd = [controller, "--model_path", os.path.join(src, "tests/data/tiny-qwen3-moe"),
               "--spawn_agents", "1", "--http_address", "127.0.0.1:0",
               "--grpc_address", "127.0.0.1:0", "--admin_address", "127.0.0.1:0",
               "--metrics_address", "127.0.0.1:0", "--agent_binary", agent,
               "--agent_host_memory_bytes", "268435456", "--agent_host_page_bytes", "4096",
               "--max_offload_ratio", "0.5", "--ready_file", ready_file,
               "--auth_token_file", token_file, "--replica", "live-test",
               "--log_format", "json", "--log_file", log_file]
        controller_proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL,
                                           stderr=open(os.path.join(tmp, "stderr"), "w"))
        procs.append(controller_proc)

        def ready_ports():
            if controller_proc.poll() is not None:
                log = open(log_file).read()[-2000:] if os.path.exists(log_file) else ""
                fail(f"vamp-controller exited with {controller_proc.returncode}; log: {log}")
            return json.load(open(ready_file)) if os.path.getsize(ready_file) else None

        wait_for("the controller's ready file", lambda: os.path.exists(ready_file) and ready_ports(), 20)
        ports = ready_ports()
        http = f"http://127.0.0.1:{ports['http_port']}"
        admin = f"127.0.0.1:{ports['admin_port']}"

        def healthy():
            try:
                http_get(http + "/health")
                return True
            except urllib.error.HTTPError:
                return False

        wait_for("the model to be served (/health)", healthy, 60)

        def agent_targets():
            groups = json.loads(http_get(http + "/metrics/targets"))
            return groups if any(g["labels"].get("vamp_role") == "agent" for g in groups) else None

        groups = wait_for("the agent in /metrics/targets", agent_targets, 20)
        roles = sorted(g["labels"]["vamp_role"] for g in groups)
        if roles != ["agent", "controller"]:
            fail(f"/metrics/targets lists {roles}, want one controller and one agent: {groups}")
        for g in groups:
            if g["labels"].get("replica") != "live-test":
                fail(f"target group without replica=live-test: {g}")
        agent_group = next(g for g in groups if g["labels"]["vamp_role"] == "agent")
        if agent_group["labels"].get("rank") != "0":
            fail(f"agent target without rank 0: {agent_group}")
        controller_group = next(g for g in groups if g["labels"]["vamp_role"] == "controller")
        if controller_group["targets"] != [f"127.0.0.1:{ports['metrics_port']}"]:
            fail(f"controller target {controller_group['targets']} is not its metrics port")

        # Prometheus, started by scripts/observe.sh: scrapes what the controller publishes and
        # evaluates the rules.
        prom_port = free_port()
        rules = os.path.join(src, "dashboards/prometheus/vamp-rules.yml")
        prom = subprocess.Popen(
            ["bash", os.path.join(src, "scripts/observe.sh"), "--controller", http,
             "--port", str(prom_port), "--dir", os.path.join(tmp, "observe"),
             "--scrape-interval", "1s"],
            stdout=subprocess.DEVNULL, stderr=open(os.path.join(tmp, "prometheus.log"), "w"))
        procs.append(prom)
        api = f"http://127.0.0.1:{prom_port}/api/v1"
        wait_for("Prometheus to be ready", lambda: http_get(f"http://127.0.0.1:{prom_port}/-/ready"), 30)

        def targets_up():
            active = json.loads(http_get(api + "/targets"))["data"]["activeTargets"]
            return len(active) == 2 and all(t["health"] == "up" for t in active)

        wait_for("Prometheus to scrape both targets", targets_up, 30)

        # Traffic while Prometheus scrapes: plain requests, a repeated prompt (prefix hits), an
        # offload of expert groups (remaps, staging), requests on it, and the restore.
        prompt = "The quick brown fox jumps over the lazy dog. " * 3
        body = {"prompt": prompt, "max_tokens": 8, "temperature": 0, "ignore_eos": True}
        for _ in range(2):
            http_post_json(http + "/v1/completions", body)
        ctl = [vampctl, "--endpoint", admin, "--token-file", token_file]
        subprocess.run(ctl + ["offload", "1"], check=True, stdout=subprocess.DEVNULL, timeout=60)
        for _ in range(2):
            http_post_json(http + "/v1/completions", body)
        subprocess.run(ctl + ["restore", "1"], check=True, stdout=subprocess.DEVNULL, timeout=60)
        http_post_json(http + "/v1/completions", dict(body, max_tokens=4))

        controller_text = http_get(f"http://127.0.0.1:{ports['metrics_port']}/metrics")
        agent_text = http_get(f"http://{agent_group['targets'][0]}/metrics")
        families = exported_families(controller_text)
        families.update(exported_families(agent_text))
        for name, source in NO_SERIES_YET.items():
            if name in families:
                continue
            if f'"{name}"' not in open(os.path.join(src, source)).read():
                fail(f"{name} is neither exported nor registered in {source}")
            families[name] = ["counter", False]

        # Queries of the dashboards and the rules.
        dashboards = sorted(glob.glob(os.path.join(src, "dashboards/*.json")))
        if not dashboards:
            fail("no dashboards in dashboards/")
        panel_queries = []
        variable_queries = []
        for path in dashboards:
            board = json.load(open(path))
            for panel in board["panels"]:
                for t in panel.get("targets", []):
                    panel_queries.append((os.path.basename(path), panel["title"], t["expr"]))
            for v in board["templating"]["list"]:
                if v["type"] == "query":
                    variable_queries.append((os.path.basename(path), v["name"], v["query"]["query"]))
        rule_doc = yaml.safe_load(open(rules))
        recorded = set()
        rule_queries = []
        for group in rule_doc["groups"]:
            for rule in group["rules"]:
                if "record" in rule:
                    recorded.add(rule["record"])
                rule_queries.append((group["name"], rule.get("record") or rule["alert"], rule["expr"]))

        # 1. Every name is exported (or recorded).
        problems = []
        for where, title, expr in panel_queries + rule_queries + variable_queries:
            for name in metric_names(expr):
                if name.startswith("vamp:"):
                    if name not in recorded:
                        problems.append(f"{where} / {title}: '{name}' is not recorded by a rule")
                elif family_of(name, families) is None:
                    problems.append(f"{where} / {title}: '{name}' is not exported by the "
                                    "controller or the agent")
        if problems:
            fail("queries name metrics the processes do not export:\n  " + "\n  ".join(problems))

        # Rate windows need a few scrapes after the traffic.
        time.sleep(4)

        def query(expr):
            url = api + "/query?" + urllib.parse.urlencode({"query": expr})
            try:
                answer = json.loads(http_get(url))
            except urllib.error.HTTPError as e:
                answer = json.loads(e.read().decode())
            if answer.get("status") != "success":
                return None, answer.get("error", answer)
            return answer["data"]["result"], None

        # 2. Every dashboard query is accepted and returns data.
        empty_ok = {n for n, (_, has) in families.items() if not has}
        for where, title, expr in panel_queries:
            q = expand(expr)
            result, error = query(q)
            if error is not None:
                problems.append(f"{where} / {title}: rejected: {q}: {error}")
                continue
            if not result:
                names = {family_of(n, families) for n in metric_names(expr)}
                if not names & empty_ok:
                    # The data may lag a scrape behind: ask again once.
                    time.sleep(2)
                    result, _ = query(q)
                    if not result:
                        problems.append(f"{where} / {title}: no data: {q}")
        # 3. Variables find their labels.
        for where, name, expr in variable_queries:
            m = re.fullmatch(r"label_values\((.*),\s*(\w+)\)", expr)
            if not m:
                problems.append(f"{where}: variable {name}: not label_values(metric, label): {expr}")
                continue
            result, error = query(expand(m.group(1)))
            values = {r["metric"].get(m.group(2)) for r in result or []} - {None}
            if error is not None or not values:
                problems.append(f"{where}: variable {name}: no '{m.group(2)}' values from "
                                f"{m.group(1)} ({error})")
        # 4. Every rule expression is accepted.
        for group, name, expr in rule_queries:
            _, error = query(expr)
            if error is not None:
                problems.append(f"rule {group} / {name}: rejected: {error}")
        if problems:
            fail("dashboard or rule queries failed:\n  " + "\n  ".join(problems))

        # 5. Stop the controller: it (and its agent) must exit cleanly, and STOPPING=1 follows.
        controller_proc.send_signal(signal.SIGTERM)
        controller_proc.wait(timeout=30)
        if controller_proc.returncode != 0:
            fail(f"vamp-controller exited with {controller_proc.returncode} on SIGTERM")
        time.sleep(0.3)  # the reader's last recv
        joined = "|".join(messages)
        if sum(m.startswith("READY=1") for m in messages) != 1:
            fail(f"want exactly one READY=1 (the agent must not notify): {joined}")
        for want in ("WATCHDOG=1", "STOPPING=1", "STATUS=serving"):
            if want not in joined:
                fail(f"no {want} among the notifications: {joined}")

        # 6. Logs: JSON lines from both processes, one line per finished request, no token.
        log_text = open(log_file).read()
        if TOKEN in log_text or TOKEN in open(os.path.join(tmp, "stderr")).read():
            fail("the auth token appears in the logs")
        lines = [json.loads(line) for line in log_text.splitlines()]
        for line in lines:
            if set(line) != {"ts", "level", "file", "line", "tid", "msg"}:
                fail(f"log line with unexpected fields: {line}")
        files = {line["file"] for line in lines}
        if "agent_service.cc" not in files or "controller_server.cc" not in files:
            fail(f"want controller and agent lines in the shared log file, got files {files}")
        finished = [l["msg"] for l in lines if re.match(r"request \S+ finished: ", l["msg"])]
        if len(finished) != 5:
            fail(f"want 5 request completion lines, got {len(finished)}: {finished}")
        if not re.search(r"reason length, prompt_tokens \d+ \(cached \d+\), output_tokens 8, "
                         r"ttft_s [0-9.e-]+, e2e_s [0-9.e-]+", finished[0]):
            fail(f"unexpected request completion line: {finished[0]}")
        print(f"live scrape: {len(panel_queries)} dashboard queries, {len(variable_queries)} "
              f"variables, {len(rule_queries)} rules, {len(families)} metric families, "
              f"{len(lines)} log lines checked in {time.time() - started:.1f} s")
        return 0
    finally:
        for p in reversed(procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        if notify is not None:
            notify.close()
        if os.environ.get("VAMP_KEEP_TEST_DIR"):
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    signal.signal(signal.SIGALRM, lambda *_: (_ for _ in ()).throw(
        AssertionError(f"live scrape test ran over {DEADLINE_S} s")))
    signal.alarm(DEADLINE_S)
    try:
        sys.exit(main())
    except AssertionError as e:
        print(f"FAIL: {e}", file=sys.stderr)
        sys.exit(1)
