"""One-call weight swap inside vLLM's engine core (``POST /collective_rpc`` method ``agrpo_swap``).

Why: vLLM's RL flow is one HTTP call per phase (pause, start, update, finish, label, reset,
resume), and generation stays paused across all of those round trips. In an async run on a
busy host each round trip waits for the API server to be scheduled, and on the 2-core CPU demo
the pause took a fifth of an async step (docs/measurements/async-measurements.md). Here the engine core runs the whole sequence itself,
between two scheduler steps: pause(keep) -> once idle, the worker calls the trainer listed
(e.g. start_weight_update, update_weights, finish_weight_update) -> reset the prefix cache
(preempting running requests, recomputed under the new weights; or kept, with the cache, when
the caller's requests salt their prompts' cache by version) -> set the weight label -> resume
-> wake the engine's loop (see :func:`wake`). Generation stops only for the load itself.

Exactness is vLLM's pause: the calls run only once the engine is idle (its batch queue
drained), so every output before the label change came from the old weights and every token
after it from the new ones; per-token weight-version spans stay exact.

Installed by :func:`install` from the plugin's ``register`` in the engine-core process (vLLM
loads general plugins in ``EngineCore.__init__``): it wraps ``EngineCore.collective_rpc`` so
the one method name ``agrpo_swap`` is handled by the engine and every other name reaches the
workers as before. The argument is one JSON string (vLLM's HTTP route passes strings only):
``{"probe": true}`` or ``{"calls": [{"method", "args", "kwargs"}...], "on_failure": [...],
"label": str, "failed_label": str, "reset_prefix_cache": bool, "reset_running": bool,
"timeout": float}``.
"""

import json
import time
from concurrent.futures import Future

SWAP_METHOD = "agrpo_swap"


def install() -> bool:
    """Wrap ``EngineCore.collective_rpc`` once per process (a forked engine core inherits
    it); False when this vLLM's engine lacks what the swap needs."""
    try:
        from vllm.v1.engine import core
    except ImportError:
        return False
    cls = getattr(core, "EngineCore", None)
    needed = ("collective_rpc", "pause_scheduler", "resume_scheduler", "reset_prefix_cache",
              "set_weight_version")
    if cls is None or not all(hasattr(cls, name) for name in needed):
        return False
    if getattr(cls.collective_rpc, "agrpo_swap", False):
        return True
    original = cls.collective_rpc

    def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
        if method == SWAP_METHOD:
            return swap(self, *args)
        return original(self, method, timeout, args, kwargs)

    collective_rpc.agrpo_swap = True
    cls.collective_rpc = collective_rpc
    return True


def refusal(engine) -> str:
    """Why this engine cannot swap in one call ("" when it can). Data-parallel engines pause
    in coordinated waves, which one engine's own pause would break."""
    parallel = engine.vllm_config.parallel_config
    if getattr(parallel, "data_parallel_size", 1) > 1:
        return f"data_parallel_size={parallel.data_parallel_size}: engines pause together"
    return ""


def swap(engine, spec_json: str):
    """Pause, then (once idle) load, reset, label, resume. A list of one result dict, or a
    Future of it while the engine drains the step in flight (vLLM answers the utility call
    when the Future completes)."""
    spec, why = json.loads(spec_json), refusal(engine)
    if spec.get("probe") or why:
        return [{"ok": not why, "why": why}]
    t0 = time.perf_counter()
    done: Future = Future()

    def when_idle(pause: Future | None = None) -> None:
        try:
            if pause is not None:
                pause.result()
            done.set_result([load(engine, spec, time.perf_counter() - t0)])
        except BaseException as exc:  # noqa: BLE001 - answered to the caller as the RPC's failure
            done.set_exception(exc)

    pending = engine.pause_scheduler(mode="keep", clear_cache=False)
    if pending is None:
        when_idle()
    else:
        pending.add_done_callback(when_idle)
    return done


def load(engine, spec: dict, drain_s: float) -> dict:
    """The worker calls, in order, on an idle engine. On a failure the `on_failure` calls run
    (best effort), the label becomes `failed_label` and the engine stays paused: it never
    serves half-loaded weights, and the trainer re-syncs it."""
    timeout = spec.get("timeout")
    t0 = time.perf_counter()
    try:
        for call in spec["calls"]:
            engine.model_executor.collective_rpc(call["method"], timeout, tuple(call.get("args") or ()),
                                                 call.get("kwargs") or None)
    except Exception:
        for call in spec.get("on_failure") or ():
            try:
                engine.model_executor.collective_rpc(call["method"], timeout, tuple(call.get("args") or ()),
                                                     call.get("kwargs") or None)
            except Exception:  # noqa: BLE001 - the first failure is the one reported
                pass
        engine.set_weight_version(spec.get("failed_label", "partial"))
        raise
    loaded = time.perf_counter()
    if spec.get("reset_prefix_cache", True):
        engine.reset_prefix_cache(reset_running_requests=bool(spec.get("reset_running")))
    engine.set_weight_version(str(spec["label"]))
    engine.resume_scheduler()
    wake(engine)
    return {"ok": True, "drain_s": drain_s, "load_s": loaded - t0, "reset_s": time.perf_counter() - loaded}


def wake(engine) -> None:
    """Make the engine's busy loop look for work again after a resume from inside its idle
    callback. The loop runs that callback just before it blocks on its input queue, so without
    a wake-up the resumed requests wait for the next request or abort to arrive: seconds in the
    async CPU demo with one request per group, where nothing new arrives until a group finishes
    (docs/measurements/async-measurements.md, "One request per group"). (When the pause completes at once, the swap runs as a utility call and the loop
    re-checks by itself; the extra wake-up is then a no-op.)"""
    queue = getattr(engine, "input_queue", None)  # an in-process engine has no loop to wake
    if queue is None:
        return
    from vllm.v1.engine import EngineCoreRequestType

    wakeup = getattr(EngineCoreRequestType, "WAKEUP", None)
    if wakeup is not None:
        queue.put_nowait((wakeup, None))
