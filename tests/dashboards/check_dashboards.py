#!/usr/bin/env python3
"""Static checks of dashboards/*.json (no Prometheus needed; live_scrape_test.py runs the queries).

Usage: check_dashboards.py SOURCE_DIR
  * the committed JSON is what dashboards/generate.py writes;
  * each dashboard has a uid, a title, a datasource variable (type datasource, prometheus) and
    replica and rank query variables; every panel and query uses the ${datasource} variable;
  * panel ids are unique, every panel has a gridPos, every query a refId and an expression that
    filters on $replica;
  * together the dashboards cover every view the issue lists (by the metrics they query).
"""
import glob
import json
import os
import subprocess
import sys

# View -> a metric its query must use.
REQUIRED = {
    "KV utilisation": "vamp_kv_usage_ratio",
    "KV pool size per rank": "vamp_agent_kv_pool_bytes",
    "offload ratio per rank": "vamp_agent_offloaded_groups",
    "resident expert bytes": "vamp_agent_resident_expert_bytes",
    "offloaded expert bytes": "vamp_agent_offloaded_expert_bytes",
    "prefix-cache hit rate": "vamp_prefix_cache_hit_tokens_total",
    "preemptions": "vamp_scheduler_preemptions_total",
    "arbiter decisions by action": "vamp_arbiter_decisions_total",
    "TTFT quantiles": "vamp_request_time_to_first_token_seconds_bucket",
    "inter-token quantiles": "vamp_request_inter_token_latency_seconds_bucket",
    "end-to-end quantiles": "vamp_request_e2e_latency_seconds_bucket",
    "queue time": "vamp_request_queue_time_seconds_bucket",
    "staging bandwidth": "vamp_agent_staged_bytes_total",
    "exposed stall per step": "vamp_agent_staging_stall_seconds",
    "remap latency": "vamp_agent_remap_duration_seconds_bucket",
    "agent up/down": 'up{vamp_role="agent"',
}


def main():
    src = sys.argv[1]
    problems = []
    gen = subprocess.run([sys.executable, os.path.join(src, "dashboards/generate.py"), "--check"],
                         capture_output=True, text=True)
    if gen.returncode != 0:
        problems.append(gen.stdout.strip() or gen.stderr.strip())
    paths = sorted(glob.glob(os.path.join(src, "dashboards/*.json")))
    if not paths:
        problems.append("no dashboards/*.json")
    exprs = []
    uids = set()
    for path in paths:
        name = os.path.basename(path)
        board = json.load(open(path))
        for key in ("uid", "title", "panels", "templating", "schemaVersion"):
            if key not in board:
                problems.append(f"{name}: no {key}")
        if board.get("uid") in uids:
            problems.append(f"{name}: uid {board.get('uid')} is used twice")
        uids.add(board.get("uid"))
        variables = {v["name"]: v for v in board["templating"]["list"]}
        ds = variables.get("datasource")
        if not ds or ds.get("type") != "datasource" or ds.get("query") != "prometheus":
            problems.append(f"{name}: needs a 'datasource' variable of type datasource (prometheus)")
        for v in ("replica", "rank"):
            if variables.get(v, {}).get("type") != "query":
                problems.append(f"{name}: needs a '{v}' query variable")
            elif variables[v]["datasource"].get("uid") != "${datasource}":
                problems.append(f"{name}: variable {v} must use ${{datasource}}")
        ids = set()
        for panel in board["panels"]:
            title = panel.get("title")
            if panel.get("id") in ids:
                problems.append(f"{name}: panel id {panel.get('id')} is used twice")
            ids.add(panel.get("id"))
            if "gridPos" not in panel:
                problems.append(f"{name} / {title}: no gridPos")
            if panel["type"] == "row":
                continue
            if panel.get("datasource", {}).get("uid") != "${datasource}":
                problems.append(f"{name} / {title}: panel datasource must be ${{datasource}}")
            if not panel.get("targets"):
                problems.append(f"{name} / {title}: no queries")
            for t in panel.get("targets", []):
                if t.get("datasource", {}).get("uid") != "${datasource}" or not t.get("refId"):
                    problems.append(f"{name} / {title}: query without ${{datasource}} or refId")
                if '$replica' not in t.get("expr", ""):
                    problems.append(f"{name} / {title}: query ignores $replica: {t.get('expr')}")
                exprs.append(t.get("expr", ""))
    joined = "\n".join(exprs)
    for view, metric in REQUIRED.items():
        if metric not in joined:
            problems.append(f"no dashboard shows {view} (a query on {metric})")
    if problems:
        print("check_dashboards:\n  " + "\n  ".join(problems), file=sys.stderr)
        return 1
    print(f"check_dashboards: {len(paths)} dashboards, {len(exprs)} queries, all views covered")
    return 0


if __name__ == "__main__":
    sys.exit(main())
