"""Fixed timeouts and periods of the services and the launcher, in one place (seconds).

Only waits that are not config keys live here, each read at its call sites by name. Waits a
deployment tunes (peer deadlines, vLLM start-up, collectives, NCCL) are config keys instead
(docs/config.md).
"""

from __future__ import annotations

# Trainer

COLD_SYNC_RETRY_S = 2.0
"""Pause between cold-sync attempts while servers come up: no spinning, small against vllm_server_timeout."""

RANK_WATCH_PERIOD_S = 5.0
"""How often rank 0 reads the other ranks' heartbeats for its health status; a few seconds late is fine."""

RANK_SILENT_S = 30.0
"""A waiting rank silent this long makes health NOT_SERVING: many RANK_BEAT_S, so a busy host is not a dead rank."""

RANK_BEAT_S = 2.0
"""How often a rank waiting for a command bumps its heartbeat counter in the store: well under RANK_SILENT_S."""

# Rollout

GAUGE_PERIOD_S = 1.0
"""How often rollout refreshes its Prometheus gauges: finer than any scrape, and cheap."""

WEIGHT_LABEL_PERIOD_S = 5.0
"""How often rollout reads each server's weight label (status only): an HTTP GET per server, so rarer than gauges."""

WEIGHT_LABEL_TIMEOUT_S = 5.0
"""Limit of rollout's GET /weight_info: a status read must not hold up the gauge loop for long."""

VLLM_GET_TIMEOUT_S = 10.0
"""Limit of rollout's handshake GETs (/version, /is_paused, /v1/models): a live server answers them at once."""

VLLM_HEALTH_TIMEOUT_S = 5.0
"""Limit of one GET /health: a server that cannot answer it this fast counts as down."""

GENERATE_PROBE_TIMEOUT_S = 60.0
"""Limit of the one-token request probing /inference/v1/generate: a cold server may warm up first."""

ABORT_TIMEOUT_S = 5.0
"""Limit of a best-effort abort of in-flight requests: cancelling the HTTP call aborts them anyway."""

ISSUE_RECHECK_S = 0.5
"""Longest the rollout engine sleeps without capacity before it looks again (a wake-up usually comes first)."""

RECONNECT_MAX_S = 10.0
"""Cap of the doubling back-off of rollout's trainer streams and Score retries: a peer back up is found soon."""

HEARTBEAT_MIN_TIMEOUT_S = 1.0
"""Floor of a heartbeat's deadline (heartbeat_interval_s): a tiny interval must not time every heartbeat out."""

# Reward

ITEM_TIMEOUT_S = 5.0
"""Default per-completion limit of the built-in rewards' parse and verify: past it an item scores TIMEOUT."""

WORKER_RESTART_BACKOFF_S = 0.5
"""First pause before retrying to replace a reward worker that failed to start; it doubles."""

WORKER_RESTART_BACKOFF_MAX_S = 30.0
"""Cap of that back-off: a broken reward module is retried twice a minute, not in a hot loop."""

# A vLLM server process (agrpo/launcher/vllm_process.py)

VLLM_START_TIMEOUT_S = 240.0
"""Default limit for a vLLM server to answer /health after its start (a CPU model loads and warms up)."""

VLLM_LAUNCH_TIMEOUT_S = 600.0
"""The launcher's limit for the same: a GPU server also captures CUDA graphs and a first start compiles."""

VLLM_START_POLL_TIMEOUT_S = 2.0
"""Limit of one /health poll while a server starts: a server still loading refuses or stalls; poll again."""

VLLM_REQUEST_TIMEOUT_S = 120.0
"""Default limit of one request to a server from its handle (weight pushes, tests): a full reload fits."""

VLLM_PROBE_TIMEOUT_S = 60.0
"""Limit of the subprocess that asks a vLLM install what it supports: it imports vLLM, which is slow."""

PROCESS_EXIT_WAIT_S = 10.0
"""How long to wait for a killed process to be reaped: SIGKILL ends it at once; a longer wait means a zombie."""

HEALTH_CHECK_TIMEOUT_S = 2.0
"""Limit of one gRPC health Check while waiting for a service to come up."""

# Launcher (agrpo run, the demo)

TRAINER_STOP_EXTRA_S = 30.0
"""What the launcher adds to trainer.grace_s before killing a stopping trainer: it saves a checkpoint last."""

SERVICE_STOP_GRACE_S = 15.0
"""How long rollout and reward get to stop after SIGTERM: they hold nothing that must be written."""

VLLM_STOP_GRACE_S = 20.0
"""How long a vLLM server gets to stop after SIGTERM before it is killed."""

RESTART_BACKOFF_S = 2.0
"""First pause before `agrpo run` restarts a crashed service; it doubles with each crash in the window."""

RESTART_BACKOFF_MAX_S = 30.0
"""Cap of that back-off."""

RESTART_WINDOW_S = 600.0
"""The window in which a service's crashes are counted against launcher.max_restarts."""

STATUS_CALL_TIMEOUT_S = 5.0
"""Limit of the launcher's GetStatus call: a service too busy to answer this fast is polled again later."""

STATUS_POLL_S = 0.5
"""How often `agrpo run` checks its processes and the trainer's status while the run goes on."""

ROLLOUT_STATUS_POLL_S = 1.0
"""How often `agrpo run` polls rollout's status (it only feeds the summary, so rarer than the trainer's)."""
