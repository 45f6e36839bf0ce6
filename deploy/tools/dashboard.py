"""The Grafana dashboard "agrpo", as data: rows of panels, each a few PromQL queries.

gen_observability.py renders it to deploy/grafana/dashboards/agrpo.json and checks
that every series a query reads exists (metrics_catalog).
"""

from __future__ import annotations

DS = {"type": "prometheus", "uid": "${datasource}"}


def q95(metric: str, by: str = "") -> str:
    """p95 of a histogram over 5 minutes, optionally per label."""
    group = f"le, {by}" if by else "le"
    return f"histogram_quantile(0.95, sum by ({group}) (rate({metric}_bucket[5m])))"


def avg_hist(metric: str, by: str = "") -> str:
    """Mean of a histogram's observations over 5 minutes."""
    group = f" by ({by})" if by else ""
    return f"sum{group} (rate({metric}_sum[5m])) / sum{group} (rate({metric}_count[5m]))"


# (row title, [(panel title, kind, unit, description, [(expr, legend), ...]), ...])
ROWS = [
    ("Training progress", [
        ("Optimizer step", "stat", "none", "Steps taken by the trainer.",
         [("max(agrpo_trainer_step)", "step")]),
        ("Policy version", "timeseries", "none",
         "Trainer's version and the version rollout last heard; a gap is sync lag.",
         [("max(agrpo_trainer_policy_version)", "trainer"),
          ("max(agrpo_rollout_policy_version)", "rollout")]),
        ("Trainer idle fraction", "timeseries", "percentunit",
         "Share of the last step spent waiting for samples: high means generation is the bottleneck.",
         [("max(agrpo_trainer_idle_fraction)", "idle")]),
        ("Step time", "timeseries", "s", "Compute time of one optimizer step.",
         [(q95("agrpo_trainer_step_seconds"), "p95"), (avg_hist("agrpo_trainer_step_seconds"), "mean")]),
        ("Trainer tokens/s", "timeseries", "short", "Tokens forwarded per second of compute.",
         [("sum(agrpo_trainer_tokens_per_second)", "tokens/s")]),
        ("Sample flow", "timeseries", "short", "Samples per second through the pipeline.",
         [("sum(rate(agrpo_rollout_samples_sent_total[1m]))", "sent (rollout)"),
          ("sum(rate(agrpo_trainer_samples_received_total[1m]))", "received (trainer)"),
          ("sum(rate(agrpo_trainer_samples_trained_total[1m]))", "trained")]),
    ]),
    ("Async efficiency", [
        ("Trainer idle (whole run rate)", "timeseries", "percentunit",
         ("Share of the training loop's time spent waiting for samples (5 min); pacing aims at <= 5% "
          "when generation is faster than training."),
         [(("sum(rate(agrpo_trainer_idle_seconds_total[5m])) / (sum(rate(agrpo_trainer_idle_seconds_total[5m])) "
            "+ sum(rate(agrpo_trainer_busy_seconds_total[5m])))"), "trainer idle")]),
        ("Generation in flight", "timeseries", "short",
         "Requests at vLLM, the credits rollout holds unused, and the pacing window.",
         [("sum(agrpo_rollout_inflight_requests)", "in flight"), ("sum(agrpo_rollout_credits_available)", "credits"),
          ("max(agrpo_trainer_pacing_window_samples)", "window")]),
        ("Generation idle", "timeseries", "percentunit",
         "Share of the time since generation started with no request at vLLM.",
         [("max(agrpo_rollout_generation_idle_fraction)", "generation idle")]),
        ("Dropped stale / generated", "timeseries", "percentunit",
         "Generated samples thrown away as stale (goal <= 2%).",
         [("max(agrpo_rollout_dropped_stale_share)", "stale share")]),
        ("Trainer/vLLM mismatch (k3 KL)", "timeseries", "none",
         "Mean per-token k3 KL between the trainer's logprobs at step start and vLLM's (staleness included).",
         [("max(agrpo_trainer_mismatch_k3_kl)", "k3 KL")]),
    ]),
    ("Reward", [
        ("Reward mean", "timeseries", "none", "Mean reward of scored samples (5 min) and of the last group.",
         [(avg_hist("agrpo_rollout_reward"), "mean (5m)"), ("avg(agrpo_rollout_reward_mean)", "last group")]),
        ("Reward quantiles", "timeseries", "none", "Spread of sample rewards.",
         [(f"histogram_quantile({p}, sum by (le) (rate(agrpo_rollout_reward_bucket[5m])))", f"p{int(p * 100)}")
          for p in (0.1, 0.5, 0.9)]),
    ]),
    ("Staleness and drops", [
        ("Staleness (versions behind)", "timeseries", "none",
         "Trainer version minus sample version: when sent (rollout) and when trained (trainer).",
         [(q95("agrpo_trainer_sample_staleness_versions"), "trained p95"),
          (avg_hist("agrpo_trainer_sample_staleness_versions"), "trained mean"),
          (q95("agrpo_rollout_sample_staleness_versions"), "sent p95")]),
        ("Drops by reason", "timeseries", "short", "Samples (trainer) and groups (rollout) dropped per second.",
         [("sum by (reason) (rate(agrpo_trainer_samples_dropped_total[5m]))", "trainer {{reason}}"),
          ("sum by (reason) (rate(agrpo_rollout_drops_total[5m]))", "rollout {{reason}}")]),
        ("Prompts issued and re-issued", "timeseries", "short", "Prompts per second; re-issues follow drops and failures.",
         [("sum(rate(agrpo_rollout_prompts_issued_total[5m]))", "issued"),
          ("sum(rate(agrpo_rollout_reissued_prompts_total[5m]))", "re-issued")]),
    ]),
    ("Queues and flow control", [
        ("Buffered samples", "timeseries", "short",
         "Trainer buffer (credits in use = queue_maxsize minus free slots) and samples rollout holds unacknowledged.",
         [("sum(agrpo_trainer_buffered_samples)", "trainer buffer"),
          ("sum(agrpo_rollout_buffered_samples)", "rollout unacked")]),
        ("In flight", "timeseries", "short", "Generation requests and groups in progress.",
         [("sum(agrpo_rollout_inflight_requests)", "vLLM requests"),
          ("sum(agrpo_rollout_groups_inflight)", "groups")]),
        ("Trainer silence", "timeseries", "s", "Seconds since rollout last heard from the trainer.",
         [("max(agrpo_rollout_trainer_silent_seconds)", "silent")]),
    ]),
    ("Generation", [
        ("Generation tokens/s", "timeseries", "short", "Completion tokens per second, as rollout and vLLM count them.",
         [("sum(agrpo_rollout_generation_tokens_per_second)", "rollout (window)"),
          ("sum(rate(agrpo_rollout_generated_tokens_total[1m]))", "rollout (rate)"),
          ("sum(rate(vllm:generation_tokens_total[1m]))", "vLLM")]),
        ("vLLM request latency", "timeseries", "s", "Per vLLM server, seen from rollout.",
         [(q95("agrpo_rollout_vllm_request_seconds", "server"), "p95 {{server}}")]),
        ("vLLM engine", "timeseries", "short", "Running and waiting requests, KV-cache use.",
         [("sum(vllm:num_requests_running)", "running"), ("sum(vllm:num_requests_waiting)", "waiting"),
          ("max(vllm:kv_cache_usage_perc)", "KV cache used")]),
    ]),
    ("Weight sync", [
        ("Weight-sync time per phase", "timeseries", "s", "Mean and p95 of each phase (pause, transfer, finish, ...).",
         [(avg_hist("agrpo_trainer_weight_sync_seconds", "phase"), "mean {{phase}}"),
          (q95("agrpo_trainer_weight_sync_seconds", "phase"), "p95 {{phase}}")]),
        ("Weight-sync failures", "timeseries", "short", "Failed syncs per phase (15 min).",
         [("sum by (phase) (increase(agrpo_trainer_weight_sync_failures_total[15m]))", "{{phase}}")]),
    ]),
    ("Reward service", [
        ("Reward latency", "timeseries", "s", "Score requests at the reward service and a group's scoring seen from rollout.",
         [(q95("agrpo_reward_request_latency_seconds"), "request p95"),
          (q95("agrpo_rollout_scoring_seconds"), "rollout scoring p95"),
          (q95("agrpo_reward_function_latency_seconds", "function"), "p95 {{function}}")]),
        ("Reward failures", "timeseries", "short", "Failed items, timed-out calls and non-OK requests per second.",
         [("sum by (function) (rate(agrpo_reward_function_failures_total[5m]))", "failed items {{function}}"),
          ("sum by (function) (rate(agrpo_reward_function_timeouts_total[5m]))", "timeouts {{function}}"),
          ('sum by (code) (rate(agrpo_reward_requests_total{code!="OK"}[5m]))', "requests {{code}}")]),
        ("Reward workers", "timeseries", "short", "Queue depth, busy workers, requests in flight, restarts.",
         [("sum(agrpo_reward_queue_depth)", "queued calls"), ("sum(agrpo_reward_busy_workers)", "busy workers"),
          ("sum(agrpo_reward_in_flight_requests)", "in flight"),
          ("sum by (cause) (increase(agrpo_reward_worker_restarts_total[15m]))", "restarts {{cause}}")]),
    ]),
    ("Health", [
        ("Targets up", "timeseries", "none", "1 when Prometheus scrapes the service.",
         [('up{job=~"trainer|rollout|reward|vllm"}', "{{job}} {{instance}}")]),
    ]),
]


def _panel(pid: int, title: str, kind: str, unit: str, desc: str, targets, x: int, y: int) -> dict:
    panel = {
        "id": pid, "type": kind, "title": title, "description": desc, "datasource": DS,
        "gridPos": {"h": 8, "w": 8, "x": x, "y": y},
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "targets": [{"refId": chr(ord("A") + i), "datasource": DS, "expr": expr, "legendFormat": legend}
                    for i, (expr, legend) in enumerate(targets)],
    }
    if kind == "timeseries":
        panel["options"] = {"legend": {"displayMode": "list", "placement": "bottom"},
                            "tooltip": {"mode": "multi"}}
    return panel


def build() -> dict:
    """The dashboard JSON (Grafana schema 39)."""
    panels, pid, y = [], 1, 0
    for row_title, row_panels in ROWS:
        panels.append({"id": pid, "type": "row", "title": row_title, "collapsed": False,
                       "gridPos": {"h": 1, "w": 24, "x": 0, "y": y}, "panels": []})
        pid, y = pid + 1, y + 1
        for i, spec in enumerate(row_panels):
            x = (i % 3) * 8
            if i and i % 3 == 0:
                y += 8
            panels.append(_panel(pid, *spec, x=x, y=y))
            pid += 1
        y += 8
    return {
        "uid": "agrpo", "title": "agrpo", "tags": ["agrpo", "grpo", "rl"], "timezone": "browser",
        "schemaVersion": 39, "version": 1, "editable": True, "refresh": "10s",
        "time": {"from": "now-1h", "to": "now"},
        "templating": {"list": [{"name": "datasource", "type": "datasource", "query": "prometheus",
                                 "label": "Data source", "current": {}, "hide": 0}]},
        "annotations": {"list": []},
        "panels": panels,
    }


def exprs(dashboard: dict) -> list[str]:
    """Every PromQL expression in a dashboard."""
    return [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
