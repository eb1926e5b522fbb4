#!/usr/bin/env python3
"""Writes the Grafana dashboards of VAMP (dashboards/*.json) from the panel lists below, and the
PrometheusRule (deploy/k8s/monitoring/prometheus-rule.yaml) from dashboards/prometheus/vamp-rules.yml.

The outputs are committed (Grafana imports the JSON as it is); edit this script or the rules and
run it instead of editing them: tests/dashboards checks that they match its output.

  python3 dashboards/generate.py            # rewrite dashboards/*.json
  python3 dashboards/generate.py --check    # exit 1 when a committed file differs

Every query uses only metrics the processes export (names in agent/agent_metrics.h,
controller/serving/serving_engine.cc, controller/server/controller_server.cc) or Prometheus'
own `up`, and the target labels replica, rank and vamp_role that service discovery sets (the
controller's /metrics/targets, or the Kubernetes Pod/ServiceMonitors in deploy/k8s/monitoring).
"""
import json
import os
import sys

DS = {"type": "prometheus", "uid": "${datasource}"}
R = 'replica=~"$replica"'
RR = 'replica=~"$replica", rank=~"$rank"'
RATE = "$__rate_interval"


def target(expr, legend, ref):
    return {"datasource": DS, "expr": expr, "legendFormat": legend, "refId": ref, "range": True}


class Layout:
    """Places panels left to right in rows of 24 grid units."""

    def __init__(self):
        self.panels = []
        self.x = 0
        self.y = 0
        self.next_id = 1

    def row(self, title):
        if self.x:
            self.y += 8
            self.x = 0
        self.panels.append({"type": "row", "title": title, "id": self.next_id, "collapsed": False,
                            "gridPos": {"h": 1, "w": 24, "x": 0, "y": self.y}, "panels": []})
        self.next_id += 1
        self.y += 1

    def panel(self, title, description, unit, queries, width=12, kind="timeseries", extra=None):
        if self.x + width > 24:
            self.x = 0
            self.y += 8
        refs = "ABCDEFGH"
        panel = {
            "type": kind,
            "title": title,
            "description": description,
            "id": self.next_id,
            "datasource": DS,
            "gridPos": {"h": 8, "w": width, "x": self.x, "y": self.y},
            "targets": [target(e, l, refs[i]) for i, (e, l) in enumerate(queries)],
            "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
            "options": {"legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
                        "tooltip": {"mode": "multi", "sort": "desc"}},
        }
        if extra:
            panel["fieldConfig"]["defaults"].update(extra)
        self.panels.append(panel)
        self.next_id += 1
        self.x += width


def quantiles(metric, selector, by=("replica",)):
    """p50/p90/p99 of a histogram, one series per combination of the `by` labels."""
    by_labels = ", ".join(list(by) + ["le"])
    prefix = " ".join("{{" + label + "}}" for label in by)
    return [(f"histogram_quantile({q}, sum by ({by_labels}) "
             f"(rate({metric}_bucket{{{selector}}}[{RATE}])))", f"{prefix} p{int(q * 100)}")
            for q in (0.5, 0.9, 0.99)]


def templating(with_rank):
    variables = [
        {"name": "datasource", "label": "Data source", "type": "datasource", "query": "prometheus",
         "current": {}, "hide": 0, "refresh": 1, "options": [], "regex": ""},
        {"name": "replica", "label": "Replica", "type": "query", "datasource": DS,
         "definition": "label_values(vamp_controller_build_info, replica)",
         "query": {"query": "label_values(vamp_controller_build_info, replica)",
                   "refId": "replica"},
         "includeAll": True, "multi": True, "allValue": ".*", "current": {}, "refresh": 2,
         "sort": 1, "hide": 0, "options": [], "regex": ""},
    ]
    if with_rank:
        variables.append(
            {"name": "rank", "label": "Rank", "type": "query", "datasource": DS,
             "definition": 'label_values(vamp_agent_info{replica=~"$replica"}, rank)',
             "query": {"query": 'label_values(vamp_agent_info{replica=~"$replica"}, rank)',
                       "refId": "rank"},
             "includeAll": True, "multi": True, "allValue": ".*", "current": {}, "refresh": 2,
             "sort": 3, "hide": 0, "options": [], "regex": ""})
    return {"list": variables}


def dashboard(uid, title, description, layout, with_rank):
    return {
        "uid": uid,
        "title": title,
        "description": description,
        "tags": ["vamp"],
        "editable": True,
        "graphTooltip": 1,
        "schemaVersion": 39,
        "version": 1,
        "refresh": "30s",
        "time": {"from": "now-1h", "to": "now"},
        "timepicker": {},
        "timezone": "browser",
        "annotations": {"list": []},
        "links": [{"title": "VAMP dashboards", "type": "dashboards", "tags": ["vamp"],
                   "asDropdown": True}],
        "templating": templating(with_rank),
        "panels": layout.panels,
    }


def serving():
    l = Layout()
    l.row("Replica health")
    l.panel("Agents up", "1 while Prometheus scrapes the agent (0: down or unreachable).", "none",
            [(f'up{{vamp_role="agent", {RR}}}', "{{replica}} rank {{rank}}")], width=8,
            extra={"min": 0, "max": 1})
    l.panel("Serving", "1 while a full set of agents serves the model (vamp_controller_serving).",
            "none", [(f"vamp_controller_serving{{{R}}}", "{{replica}}")], width=8,
            extra={"min": 0, "max": 1})
    l.panel("Agents initialised", "1 after the controller's Init loaded the rank's shard.", "none",
            [(f"vamp_agent_initialized{{{RR}}}", "{{replica}} rank {{rank}}")], width=8,
            extra={"min": 0, "max": 1})
    l.row("Latency")
    l.panel("Time to first token", "Arrival to first token, quantiles over all requests.", "s",
            quantiles("vamp_request_time_to_first_token_seconds", R))
    l.panel("Inter-token latency", "Between consecutive tokens of a request.", "s",
            quantiles("vamp_request_inter_token_latency_seconds", R))
    l.panel("End-to-end latency", "Arrival to the last token.", "s",
            quantiles("vamp_request_e2e_latency_seconds", R))
    l.panel("Queue time", "Arrival to first scheduling (time spent waiting).", "s",
            quantiles("vamp_request_queue_time_seconds", R))
    l.row("Load")
    l.panel("Requests running and waiting", "Running batch and waiting queue (preempted included).",
            "short", [(f"sum by (replica) (vamp_scheduler_requests_running{{{R}}})",
                       "{{replica}} running"),
                      (f"sum by (replica) (vamp_scheduler_requests_waiting{{{R}}})",
                       "{{replica}} waiting")], width=8)
    l.panel("Finished requests", "Finished requests per second by reason.", "reqps",
            [(f"sum by (reason) (rate(vamp_requests_finished_total{{{R}}}[{RATE}]))",
              "{{reason}}")], width=8)
    l.panel("Sampled tokens", "Output tokens per second (rank 0 samples for the replica).",
            "short", [(f'sum by (replica) (rate(vamp_agent_sampled_tokens_total{{{R}, rank="0"}}'
                       f"[{RATE}]))", "{{replica}}")], width=8)
    return dashboard("vamp-serving", "VAMP / Serving",
                     "Health, latency and load of VAMP model replicas.", l, with_rank=True)


def memory():
    l = Layout()
    l.row("KV cache")
    l.panel("KV cache utilisation", "Used KV blocks over all KV blocks (controller's pool).",
            "percentunit", [(f"vamp_kv_usage_ratio{{{R}}}", "{{replica}}")], width=8,
            extra={"min": 0, "max": 1})
    l.panel("Prefix-cache hit rate", "Prompt tokens served from the prefix cache over prompt "
            "tokens looked up.", "percentunit",
            [(f"sum by (replica) (rate(vamp_prefix_cache_hit_tokens_total{{{R}}}[{RATE}])) / "
              f"sum by (replica) (rate(vamp_prefix_cache_query_tokens_total{{{R}}}[{RATE}]))",
              "{{replica}}")], width=8, extra={"min": 0, "max": 1})
    l.panel("Preemptions", "Requests preempted per second (recomputed later).", "short",
            [(f"sum by (replica) (rate(vamp_scheduler_preemptions_total{{{R}}}[{RATE}]))",
              "{{replica}}")], width=8)
    l.panel("KV pool size per rank", "Mapped bytes of each rank's KV region (grows with "
            "offload).", "bytes", [(f"vamp_agent_kv_pool_bytes{{{RR}}}",
                                    "{{replica}} rank {{rank}}")], width=8)
    l.panel("KV pool blocks", "KV blocks in the controller's pool and on each rank.", "short",
            [(f"vamp_kv_pool_blocks{{{R}}}", "{{replica}} pool"),
             (f"vamp_agent_kv_pool_blocks{{{RR}}}", "{{replica}} rank {{rank}}")], width=8)
    l.panel("Offload ratio per rank", "Expert groups offloaded over the cap (VAMP-r), per rank.",
            "percentunit",
            [(f"vamp_agent_offloaded_groups{{{RR}}} / vamp_agent_max_offload_groups{{{RR}}}",
              "{{replica}} rank {{rank}}"),
             (f"vamp_kv_offload_ratio{{{R}}}", "{{replica}} controller")], width=8,
            extra={"min": 0, "max": 1})
    l.panel("Recurrent-state snapshots", "Models with linear attention (Qwen3-Next): KV blocks "
            "storing the snapshots that prefix-cache hits resume from, and captures per second "
            "(skipped: no block was free for one, so a later hit at that boundary misses).",
            "short",
            [(f"vamp_kv_snapshot_blocks{{{R}}}", "{{replica}} snapshot blocks"),
             (f"rate(vamp_state_captures_total{{{R}}}[{RATE}])", "{{replica}} captures/s"),
             (f"rate(vamp_state_captures_skipped_total{{{R}}}[{RATE}])",
              "{{replica}} skipped/s")])
    l.row("Experts")
    l.panel("Resident vs offloaded expert bytes", "Expert weights mapped on the device vs living "
            "only in pinned host memory (their pages serve the KV cache).", "bytes",
            [(f"vamp_agent_resident_expert_bytes{{{RR}}}", "{{replica}} rank {{rank}} resident"),
             (f"vamp_agent_offloaded_expert_bytes{{{RR}}}",
              "{{replica}} rank {{rank}} offloaded")])
    l.panel("Arbiter decisions by action", "Memory arbiter decisions per interval by chosen "
            "action. Their estimated costs are in the decision log: `vampctl decisions`.",
            "short", [(f"sum by (action) (increase(vamp_arbiter_decisions_total{{{R}}}[{RATE}]))",
                       "{{action}}")])
    l.panel("Arbiter: offload tax vs value of extra KV", "The tax model's latest priced boundary "
            "move (cost model 'tax'): the staging stall it costs or saves and the prefill work "
            "the extra KV serves, both summed over the arbiter's window. The pool grows when the "
            "value exceeds the tax by the margin and shrinks when the tax exceeds the value.", "s",
            [(f"vamp_arbiter_offload_tax_seconds{{{R}}}", "{{replica}} tax"),
             (f"vamp_arbiter_kv_value_seconds{{{R}}}", "{{replica}} value")])
    l.panel("Arbiter: measured reuse", "Prompt tokens over the arbiter window that a larger pool "
            "would have served (ghost-list hits) and tokens recomputed after preemptions.",
            "short",
            [(f"vamp_arbiter_ghost_hit_tokens{{{R}}}", "{{replica}} ghost hits"),
             (f"vamp_arbiter_preempt_recompute_tokens{{{R}}}", "{{replica}} preemption recompute")])
    l.panel("Arbiter: TTFT weight", "Weight the latest priced move's prefill tokens carried: "
            "1 up to vamp_ttft_weight as first tokens wait longer for memory (phased in around "
            "vamp_ttft_queue_threshold_s by vamp_ttft_weight_ramp; 1 while requests queue for "
            "compute, and 1 once admissions wait longer than vamp_ttft_max_queue_s: the queue "
            "is not draining). A line that jumps between 1 and the full weight means the ramp "
            "is off and the load sits at the threshold.",
            "short", [(f"vamp_arbiter_ttft_weight{{{R}}}", "{{replica}} weight")])
    l.panel("Admissions held at the static pool", "Steps whose admissions stopped where a static "
            "split's pool would, although offloaded groups had room: the GPU was compute-bound "
            "(--admit_within_baseline), so more running requests would only slow decoding.",
            "short", [(f"rate(vamp_admissions_held_total{{{R}}}[{RATE}])", "{{replica}} held/s")])
    l.row("Steps and staging")
    l.panel("Step time", "Time to apply one step on a rank (remaps, forward pass, sampling).", "s",
            quantiles("vamp_agent_step_duration_seconds", RR, by=("replica", "rank")))
    l.panel("Exposed staging stall per step", "Mean time per step the forward pass waited for "
            "offloaded experts (copy time not hidden behind compute), and the share of step time "
            "it takes (the offload tax).", "s",
            [(f"sum by (replica, rank) (rate(vamp_agent_staging_stall_seconds_sum{{{RR}}}"
              f"[{RATE}])) / sum by (replica, rank) (rate(vamp_agent_staging_stall_seconds_count"
              f"{{{RR}}}[{RATE}]))", "{{replica}} rank {{rank}} mean"),
             (f"histogram_quantile(0.99, sum by (replica, rank, le) "
              f"(rate(vamp_agent_staging_stall_seconds_bucket{{{RR}}}[{RATE}])))",
              "{{replica}} rank {{rank}} p99")])
    l.panel("Offload tax", "Share of step time spent waiting for staged experts.", "percentunit",
            [(f"sum by (replica, rank) (rate(vamp_agent_staging_stall_seconds_sum{{{RR}}}"
              f"[{RATE}])) / sum by (replica, rank) (rate(vamp_agent_step_duration_seconds_sum"
              f"{{{RR}}}[{RATE}]))", "{{replica}} rank {{rank}}")], width=8)
    l.panel("Staging bandwidth", "Offloaded expert bytes copied host -> device per second.",
            "Bps", [(f"rate(vamp_agent_staged_bytes_total{{{RR}}}[{RATE}])",
                     "{{replica}} rank {{rank}}")], width=8)
    l.panel("Remap latency", "One expert <-> KV remap (offload or restore) on a rank.", "s",
            quantiles("vamp_agent_remap_duration_seconds", RR, by=("replica", "action")), width=8)
    l.panel("Remaps by result", "Remaps per interval by action and result (error and rollback "
            "are failures).", "short",
            [(f"sum by (action, result) (increase(vamp_agent_remaps_total{{{RR}}}[{RATE}]))",
              "{{action}} {{result}}")], width=12)
    l.panel("Step errors", "Steps a rank answered with an error.", "short",
            [(f"sum by (replica, rank) (increase(vamp_agent_step_errors_total{{{RR}}}[{RATE}]))",
              "{{replica}} rank {{rank}}")], width=12)
    return dashboard("vamp-memory", "VAMP / Memory and offload",
                     "KV cache, expert offload, arbiter and staging of VAMP model replicas.", l,
                     with_rank=True)


def prometheus_rule(rules_text):
    """The rules as a PrometheusRule for the Prometheus Operator (deploy/k8s/monitoring)."""
    lines = rules_text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("groups:"))
    body = "\n".join(("  " + line) if line else "" for line in lines[start:])
    return ("# Generated by dashboards/generate.py from dashboards/prometheus/vamp-rules.yml: edit\n"
            "# those, not this file.\n"
            "apiVersion: monitoring.coreos.com/v1\n"
            "kind: PrometheusRule\n"
            "metadata:\n"
            "  name: vamp\n"
            "  labels:\n"
            "    app.kubernetes.io/name: vamp\n"
            "spec:\n" + body + "\n")


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    check = "--check" in sys.argv[1:]
    stale = []
    rules = open(os.path.join(here, "prometheus", "vamp-rules.yml")).read()
    outputs = [(name, json.dumps(board, indent=2, sort_keys=True) + "\n")
               for name, board in (("vamp-serving.json", serving()), ("vamp-memory.json", memory()))]
    outputs.append(("../deploy/k8s/monitoring/prometheus-rule.yaml", prometheus_rule(rules)))
    for name, text in outputs:
        path = os.path.join(here, name)
        if check:
            old = open(path).read() if os.path.exists(path) else ""
            if old != text:
                stale.append(name)
        else:
            with open(path, "w") as f:
                f.write(text)
    if stale:
        print("dashboards out of date (run python3 dashboards/generate.py): " + ", ".join(stale))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
