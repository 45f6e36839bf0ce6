"""Reward service throughput and latency vs TRL's in-process scoring, in one run.

Scores synthetic groups (G completions ending in \\boxed{answer}, about half right) with
the `accuracy` built-in at a few concurrency levels, two ways:

- service:  Score RPCs to `agrpo reward` started as a subprocess (real gRPC over a
            socket, worker processes, math-verify timeouts on, per-call deadline);
- trl-like: the same built-in called in this process the way TRL's async rollout worker
            does it, `await asyncio.to_thread(fn, **kwargs)` (math-verify timeouts off).

`--style gsm8k` (default) gives GSM8K-like worked answers with integer results;
`--style latex` gives fractions and radicals written differently from the gold answer,
which makes math-verify do real symbolic work. Every measured run uses fresh texts
(math-verify caches parses). Prints one table: scores/s, request p50 and p99 latency.
Speed depends on the machine, so this is a script, not a test:

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/reward_bench.py [--style latex] [--requests 96]

`--overload X` measures shedding instead: capacity (OK scores/s with `--concurrency`
callers in a closed loop, for `--duration` seconds), then an open loop that sends X times
that many requests per second for `--duration` seconds, each with a `--deadline`, then
capacity once more (the mean of both is the reference). It prints the share of each
status code, how long refusals took, and the goodput: OK scores per second answered
within the deadline, after the first `--warmup` seconds, against capacity. The server keeps its default `reward.max_queue` unless `--max-queue` is given:

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/reward_bench.py --overload 10 --duration 45

On a small machine the load generator's CPU is taken from the server it measures (at 10x it
sends ten times the calls it sends at capacity): `--server-cpus 0 --client-cpus 1` gives each
its own cores, as when the load comes from other machines. `--worker-cpus 1,2` then moves the
scoring workers off the front's cores (`--server-cpus 0`), so refusing the excess takes no CPU
from scoring.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
os.environ.setdefault("OMP_NUM_THREADS", "1")

from google.protobuf import struct_pb2  # noqa: E402
from grpc_health.v1 import health_pb2, health_pb2_grpc  # noqa: E402

from agrpo.launcher.affinity import cores, pin_threads  # noqa: E402
from agrpo.services.common.channels import open_channel  # noqa: E402
from agrpo.services.reward.builtins import Accuracy  # noqa: E402
from agrpo.v1 import reward_service_pb2 as pb  # noqa: E402
from agrpo.v1 import reward_service_pb2_grpc as reward_grpc  # noqa: E402

SERVICE = "agrpo.v1.RewardService"
NAMES = ["Natalia", "Weng", "Betty", "Julie", "James", "Mark", "Albert", "Ken"]


def gsm8k_group(rng: random.Random, size: int) -> tuple[list[str], list[str]]:
    """One GSM8K-like problem: G worked answers and the gold integer."""
    a, b = rng.randint(2, 9999), rng.randint(2, 9999)
    gold = a * 2 + b
    completions = []
    for _ in range(size):
        answer = gold if rng.random() < 0.5 else gold + rng.choice([-10, -1, 1, 2, 12])
        completions.append(
            f"{rng.choice(NAMES)} sold {a} clips in April and twice as many in May, so "
            f"{a} * 2 = {a * 2}. Adding the {b} from June gives {a * 2} + {b} = {answer}. "
            f"The answer is $\\boxed{{{answer}}}$.")
    return completions, [str(gold)] * size


def latex_group(rng: random.Random, size: int) -> tuple[list[str], list[str]]:
    """One problem with a symbolic gold answer; right answers are written differently."""
    p, q, k = rng.randint(1, 97), rng.randint(2, 97), rng.randint(2, 9)
    gold = f"\\frac{{{p}}}{{{q}}} + \\sqrt{{{k * k * 2}}}"
    right = [f"\\frac{{{p * k}}}{{{q * k}}} + {k}\\sqrt{{2}}", f"{k}\\sqrt{{2}} + \\frac{{{p}}}{{{q}}}"]
    wrong = [f"\\frac{{{p + 1}}}{{{q}}} + {k}\\sqrt{{2}}", f"\\frac{{{p}}}{{{q}}} + {k}\\sqrt{{3}}"]
    completions = [f"Simplifying the radical, the result is $\\boxed{{"
                   f"{rng.choice(right if rng.random() < 0.5 else wrong)}}}$."
                   for _ in range(size)]
    return completions, [f"${gold}$"] * size


def make_requests(style: str, n: int, size: int, seed: int) -> list[tuple[list[str], list[str]]]:
    rng = random.Random(seed)
    group = gsm8k_group if style == "gsm8k" else latex_group
    return [group(rng, size) for _ in range(n)]


def to_proto(completions: list[str], solutions: list[str]) -> pb.ScoreRequest:
    req = pb.ScoreRequest(functions=[pb.RewardFunctionRef(name="accuracy_reward")])
    for completion, solution in zip(completions, solutions):
        it = req.items.add(completion=pb.Text(text=completion))
        it.columns["solution"].CopyFrom(struct_pb2.Value(string_value=solution))
    return req


async def drive(requests: list, concurrency: int, call) -> tuple[float, list[float]]:
    """Run `call(req)` over all requests with `concurrency` callers; wall time, latencies."""
    pending = list(requests)
    latencies: list[float] = []

    async def caller() -> None:
        while pending:
            req = pending.pop()
            start = time.perf_counter()
            await call(req)
            latencies.append(time.perf_counter() - start)

    start = time.perf_counter()
    await asyncio.gather(*(caller() for _ in range(concurrency)))
    return time.perf_counter() - start, latencies


def row(mode: str, concurrency: int, items: int, wall: float, lat: list[float]) -> str:
    lat = sorted(lat)
    p50 = statistics.median(lat) * 1000
    p99 = lat[min(len(lat) - 1, round(0.99 * (len(lat) - 1)))] * 1000
    return f"| {mode:<8} | {concurrency:>11} | {items / wall:>9.1f} | {p50:>8.1f} | {p99:>8.1f} |"


def start_server(workers: int, max_queue: int | None = 1024, cpus: str | None = None) -> tuple[subprocess.Popen, int]:
    """`agrpo reward` on a free port (on `cpus` only, by taskset); returns once it reports SERVING."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    queue = ["--reward.max_queue", str(max_queue)] if max_queue else []
    pin = ["taskset", "-c", cpus] if cpus else []
    proc = subprocess.Popen(
        [*pin, sys.executable, "-m", "agrpo.cli", "reward", "--reward.port", str(port),
         "--reward.metrics_port", "null", "--reward.num_workers", str(workers), *queue,
         "--reward_funcs", json.dumps([{"name": "accuracy"}])],
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    import grpc

    with grpc.insecure_channel(f"localhost:{port}") as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for _ in range(600):
            try:
                if health.Check(health_pb2.HealthCheckRequest(service=SERVICE), timeout=1).status \
                        == health_pb2.HealthCheckResponse.SERVING:
                    return proc, port
            except grpc.RpcError:
                pass
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError("agrpo reward did not start")


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (the fork server and the workers it forked)."""
    out, todo = [], [pid]
    while todo:
        parent = todo.pop()
        for task in Path(f"/proc/{parent}/task").iterdir():
            children = (task / "children").read_text().split()
            out += [int(c) for c in children]
            todo += [int(c) for c in children]
    return out


def cpu_list(text: str) -> str:
    """argparse type: a core list, checked, kept as text (taskset takes it as it is)."""
    try:
        cores(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of core numbers: {text!r} (e.g. 0 or 1,2)") from None
    return text


def pin_workers(proc: subprocess.Popen, cpus: str) -> int:
    """Move every thread of the server's child processes (its scoring workers) to `cpus`;
    the front keeps the cores it was started on. Returns how many processes moved."""
    moved = descendants(proc.pid)
    for pid in moved:
        pin_threads(pid, cpus)
    return len(moved)


async def closed_loop(stub, requests: list[pb.ScoreRequest], concurrency: int,
                      duration_s: float) -> float:
    """OK scores per second with `concurrency` callers for `duration_s` (fresh requests)."""
    pending, ok_items = list(requests), 0
    end = time.perf_counter() + duration_s

    async def caller() -> None:
        nonlocal ok_items
        while pending and time.perf_counter() < end:
            req = pending.pop()
            await stub.Score(req)
            ok_items += len(req.items)

    start = time.perf_counter()
    await asyncio.gather(*(caller() for _ in range(concurrency)))
    return ok_items / (time.perf_counter() - start)


async def open_loop(stub, requests: list[pb.ScoreRequest], rate: float, duration_s: float,
                    deadline_s: float) -> list[tuple[str, float, float, int]]:
    """Send `rate` requests/s for `duration_s`, each on its own; (code, sent at, latency, items)."""
    import grpc

    results: list[tuple[str, float, float, int]] = []
    tasks = []
    start = time.perf_counter()

    async def one(req: pb.ScoreRequest, sent: float) -> None:
        try:
            await stub.Score(req, timeout=deadline_s)
            code = "OK"
        except grpc.aio.AioRpcError as exc:
            code = exc.code().name
        results.append((code, sent - start, time.perf_counter() - sent, len(req.items)))

    for k, req in enumerate(requests):
        at = start + k / rate
        if at - start >= duration_s:
            break
        await asyncio.sleep(max(0.0, at - time.perf_counter()))
        tasks.append(asyncio.create_task(one(req, time.perf_counter())))
    await asyncio.gather(*tasks)
    return results


def overload_report(results: list[tuple[str, float, float, int]], capacity: float,
                    duration_s: float, warmup_s: float) -> None:
    """Codes, refusal and OK latencies, goodput (OK scores/s done inside the window)."""
    total = len(results)
    codes: dict[str, int] = {}
    for code, *_ in results:
        codes[code] = codes.get(code, 0) + 1
    last_sent = max(sent for _, sent, _, _ in results)
    print(f"sent {total} requests (the last {last_sent:.1f} s in; a load generator that keeps up: "
          f"{duration_s:g} s); " + ", ".join(
        f"{code} {n / total:.1%}" for code, n in sorted(codes.items(), key=lambda kv: -kv[1])))
    for code in ("RESOURCE_EXHAUSTED", "OK"):
        lat = sorted(latency for c, _, latency, _ in results if c == code)
        if lat:
            p99 = lat[min(len(lat) - 1, round(0.99 * (len(lat) - 1)))]
            print(f"{code}: p50 {statistics.median(lat) * 1000:.1f} ms, p99 {p99 * 1000:.1f} ms")
    ok = sum(items for code, sent, latency, items in results
             if code == "OK" and warmup_s <= sent + latency <= duration_s)
    goodput = ok / (duration_s - warmup_s)
    print(f"goodput {goodput:.1f} scores/s in [{warmup_s:g} s, {duration_s:g} s] against "
          f"capacity {capacity:.1f} scores/s: {goodput / capacity:.2f}x")


async def overload(args: argparse.Namespace) -> None:
    """Capacity in a closed loop, then `args.overload` times it in an open loop."""
    proc, port = start_server(args.workers, args.max_queue, args.server_cpus)
    if args.worker_cpus:
        print(f"{pin_workers(proc, args.worker_cpus)} processes of the server's workers moved to "
              f"cores {args.worker_cpus}")
    if args.client_cpus:  # the load generator: on cores of its own, like another machine's
        os.sched_setaffinity(0, cores(args.client_cpus))
    channel = open_channel(f"localhost:{port}", [SERVICE], deadline_s=120)
    stub = reward_grpc.RewardServiceStub(channel)
    try:
        await closed_loop(stub, [to_proto(*r) for r in make_requests(args.style, 8, args.group, -1)],
                          2, 30)  # warm up
        concurrency = max(args.concurrency)
        budget = int(args.duration * 400 / args.group) + 64
        fresh = [to_proto(*r) for r in make_requests(args.style, budget, args.group, 1)]
        capacity = await closed_loop(stub, fresh, concurrency, args.duration)
        rate = args.overload * capacity / args.group
        print(f"accuracy_reward, style={args.style}, groups of {args.group}, {args.workers} workers, "
              f"{os.cpu_count()} CPUs, max_queue {args.max_queue or 'default'}, server on cores "
              f"{args.server_cpus or 'all'}, workers on {args.worker_cpus or 'the same'}, load generator "
              f"on {args.client_cpus or 'all'}")
        print(f"capacity {capacity:.1f} scores/s ({concurrency} callers, closed loop); sending "
              f"{rate:.1f} requests/s ({args.overload:g}x) for {args.duration:g} s, "
              f"deadline {args.deadline:g} s")
        requests = [to_proto(*r) for r in
                    make_requests(args.style, int(rate * args.duration) + 1, args.group, 2)]
        results = await open_loop(stub, requests, rate, args.duration, args.deadline)
        # The machine may be shared: measure capacity again and use the mean of both.
        again = [to_proto(*r) for r in make_requests(args.style, budget, args.group, 3)]
        after = await closed_loop(stub, again, concurrency, args.duration)
        print(f"capacity after the overload {after:.1f} scores/s; mean {(capacity + after) / 2:.1f}")
        overload_report(results, (capacity + after) / 2, args.duration, args.warmup)
    finally:
        await channel.close()
        proc.terminate()
        proc.wait(30)


async def main(args: argparse.Namespace) -> None:
    if args.overload:
        await overload(args)
        return
    proc, port = start_server(args.workers)
    channel = open_channel(f"localhost:{port}", [SERVICE], deadline_s=120)
    stub = reward_grpc.RewardServiceStub(channel)
    protos: dict[int, pb.ScoreRequest] = {}
    accuracy = Accuracy()  # TRL's calling path: timeouts are turned off in the thread

    async def via_service(req) -> None:
        await stub.Score(protos[id(req)])

    async def trl_like(req) -> None:
        await asyncio.to_thread(accuracy, completions=req[0], solution=req[1])

    try:
        warmup = make_requests(args.style, 4, args.group, seed=-1)
        protos.update({id(r): to_proto(*r) for r in warmup})
        await drive(warmup, 2, via_service)  # warm up both paths
        await drive(warmup, 2, trl_like)
        items = args.requests * args.group
        print(f"accuracy_reward, style={args.style}, {args.requests} requests x {args.group} items, "
              f"{args.workers} workers, {os.cpu_count()} CPUs")
        print("| mode     | concurrency | scores/s | p50 ms   | p99 ms   |")
        print("|----------|-------------|----------|----------|----------|")
        seed = 0
        for concurrency in args.concurrency:
            for mode, call in (("service", via_service), ("trl-like", trl_like)):
                seed += 1
                requests = make_requests(args.style, args.requests, args.group, seed)
                protos.update({id(r): to_proto(*r) for r in requests})
                wall, lat = await drive(requests, concurrency, call)
                print(row(mode, concurrency, items, wall, lat), flush=True)
    finally:
        await channel.close()
        proc.terminate()
        proc.wait(30)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--style", choices=["gsm8k", "latex"], default="gsm8k")
    parser.add_argument("--requests", type=int, default=96)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--overload", type=float, default=0.0,
                        help="measure shedding at this multiple of capacity instead")
    parser.add_argument("--duration", type=float, default=45.0, help="seconds per overload phase")
    parser.add_argument("--deadline", type=float, default=10.0, help="overload calls' deadline (s)")
    parser.add_argument("--warmup", type=float, default=5.0,
                        help="seconds of the overload phase left out of the goodput")
    parser.add_argument("--max-queue", type=int, default=None,
                        help="overload: the server's reward.max_queue (default: the server's)")
    parser.add_argument("--server-cpus", type=cpu_list, default=None,
                        help="overload: taskset cores of the server, e.g. 0")
    parser.add_argument("--worker-cpus", type=cpu_list, default=None,
                        help="overload: move the server's scoring workers to these cores, e.g. 1,2")
    parser.add_argument("--client-cpus", type=cpu_list, default=None,
                        help="overload: cores of the load generator, e.g. 1")
    asyncio.run(main(parser.parse_args()))
