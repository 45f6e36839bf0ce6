"""gpu_weight_sync.py: our trainer's NCCL weight sync into a real vLLM server, timed per phase.

Trainer side, on its own GPU (CUDA_VISIBLE_DEVICES=<not vLLM's>), against a vLLM server
started with VLLM_SERVER_DEV_MODE=1 --weight-transfer-config '{"backend":"nccl"}'
(scripts/gpu/run_sync_bench.sh does all of it on a 2x H200 machine):

  python3 benchmarks/gpu_weight_sync.py --url http://127.0.0.1:8011 --model /tmp/qwen2-0.5b \
      --label qwen2-0.5b --rounds 5 --ws .gpu-scratch/ws --results sync.jsonl
  python3 benchmarks/gpu_weight_sync.py --table sync.jsonl [--floor floor.jsonl]

Variants, each after its own NCCL rendezvous, each a warm-up round then --rounds timed:
  ours        the trainer's WeightSyncer + NcclTransport (pause -> start -> update ->
              finish -> reset_prefix_cache -> resume), rendezvous through vLLM's helper
              (the only way a pre-0.30 server can be reached with vLLM's own objects)
  helper      vLLM's NCCLWeightTransferEngine.trainer_init/trainer_send_weights, driven
              as TRL drives it (scripts/gpu/e2e_nccl.py): pause -> start -> update thread
              || send -> finish -> resume
  ours_store  the same WeightSyncer + NcclTransport with the vLLM-free rendezvous (the
              trainer hosts the TCPStore and writes vLLM's pickled unique id itself;
              NCCL through the transport's ctypes NcclLib, as for >= 0.30 servers)
  direct      trainer.weight_load=direct: the store rendezvous, then sleep(level 0, keep)
              -> update through our worker extension (/collective_rpc, plain load_weights,
              no layerwise reload) -> reset_prefix_cache(running) -> [label] -> resume.
              vLLM must run with --worker-extension-cls agrpo_vllm_plugin.worker.AgrpoWorkerExtension.
  ipc         vLLM on the trainer's GPU (CUDA_VISIBLE_DEVICES of both the same): the CUDA IPC
              transport, then the direct load's phases; the same checks as `direct`.
ours, ours_store and helper use vLLM's load flow (weight_load=vllm) even on that server.
Checks: before any update vLLM == HF (same weights); after `ours` sends perturbed weights
vLLM's greedy output changes and agrees with HF on them (bf16 tolerance, e2e_nccl.compare);
`ours_store` sends the ORIGINAL weights back and vLLM must reproduce its first outputs
exactly (greedy tokens identical, prompt logprobs within 1e-4); `direct` then sends the
perturbed weights (greedy must change and agree with HF) and, in one more sync, the
original ones (exact reproduction again).
--ws points at the weight_sync package to test (default: services/trainer/weight_sync).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts" / "gpu"))



def log(*a):
    print(f"[sync {time.strftime('%H:%M:%S')}]", *a, flush=True)


def _e2e():
    """scripts/gpu/e2e_nccl.py (Api, wait_health, greedy, compare...); needs `requests` (device)."""
    import e2e_nccl
    return e2e_nccl


def import_weight_sync(ws: str | None):
    """The weight_sync package under test: the repo's, or a patched copy (--ws DIR)."""
    if ws:
        sys.path.insert(0, str(Path(ws).resolve()))
        import weight_sync as pkg
        from weight_sync import nccl, transports
    else:
        from agrpo.services.trainer import weight_sync as pkg
        from agrpo.services.trainer.weight_sync import nccl, transports
    return pkg, nccl, transports


def ours_rounds(ws, model, url: str, rendezvous: str, rounds: int, first_version: int,
                load: str = "vllm") -> list[dict]:
    """Warm-up (with rendezvous) + `rounds` timed syncs through WeightSyncer. rendezvous
    "ipc": the CUDA IPC transport instead of NCCL (vLLM on this GPU; always a direct load)."""
    pkg, nccl, transports = ws
    import torch

    async def go():
        if rendezvous == "ipc":
            from agrpo.services.trainer.weight_sync.ipc import IpcTransport
            transport = IpcTransport()
        else:
            transport = nccl.NcclTransport(rendezvous=rendezvous, timeout=180)
        syncer = pkg.WeightSyncer([url], transport, phase_timeout=180, total_timeout=600, load_mode=load)
        await syncer.open()
        out = []
        try:
            for r in range(rounds + 1):
                version = first_version + r
                rep = await syncer.sync(version, lambda v=version: transport.prepare(
                    transports.named_weights(model), v))
                if not rep.ok:
                    raise RuntimeError(f"sync failed: {rep.errors}")
                ph = {k: round(v * 1e3, 2) for k, v in rep.phase_s.items()}
                tl = {(f"{k[:-2]}_ms" if k.endswith("_s") else k): (round(v * 1e3, 2) if k.endswith("_s") else v)
                      for k, v in transport.last.items()}
                p2r = sum(ph.get(k, 0.0) for k in ("pause", "start", "update", "finish",
                                                   "reset_prefix_cache", "resume"))
                row = dict(round="warmup" if r == 0 else r, **{f"{k}_ms": v for k, v in ph.items()},
                           **{f"nccl_{k}": v for k, v in tl.items()}, pause_to_resume_ms=round(p2r, 2),
                           version=version)
                ext = syncer.admin(url).last_rpc if load == "direct" or rendezvous == "ipc" else []
                if ext and isinstance(ext[0], dict) and "load_s" in ext[0]:
                    row["ext_load_ms"] = round(max(e["load_s"] for e in ext) * 1e3, 2)
                out.append(row)
                log(f"ours[{rendezvous},{load}]", row)
        finally:
            await syncer.close()
        torch.cuda.synchronize()
        return out
    return asyncio.run(go())


def helper_rounds(api, model, port: int, rounds: int) -> list[dict]:
    """vLLM's own trainer helper, driven the way TRL (and e2e_nccl.py) drive it."""
    import torch
    e2e = _e2e()
    params = list(model.named_parameters())
    group, _, rdv_s, _ = e2e.helper_rendezvous(api, port)
    info = e2e.update_info(params)
    sync = torch.cuda.synchronize if params[0][1].is_cuda else (lambda: None)
    out = []
    for r in range(rounds + 1):
        t = {k: round(v, 2) for k, v in e2e.helper_round(api, group, params, info, sync).items()}
        row = dict(round="warmup" if r == 0 else r, **t)
        row["pause_to_resume_ms"] = row.pop("total_ms")
        if r == 0:
            row["rendezvous_ms"] = round(rdv_s * 1e3, 1)
        out.append(row)
        log("helper", row)
    return out


def direct_variant(a, api, served, hf, ws, version, load_hf, pert, orig, before_tok, before_pl, res,
                   name: str = "direct") -> dict:
    """Perturbed weights through the direct load (timed), checked against HF; then the
    original weights back through it, which vLLM must reproduce exactly. `name` "ipc": the
    same through the CUDA IPC transport (vLLM on the trainer's GPU)."""
    e2e = _e2e()
    way = "ipc" if name == "ipc" else "store"
    load_hf(pert)
    res["variants"][name] = ours_rounds(ws, hf, a.url, way, a.rounds, version, load="direct")
    after_tok, _ = e2e.greedy(api, served)
    c1, _ = e2e.compare(api, served, hf, after_tok, a.tol)
    c1["greedy_changed"] = after_tok != before_tok
    c1["ok"] = c1["ok"] and c1["greedy_changed"]
    log(f"after {name} (perturbed weights):", c1)
    load_hf(orig)
    ours_rounds(ws, hf, a.url, way, 0, version + a.rounds + 1, load="direct")
    c2 = check_exact(api, served, before_tok, before_pl)
    log(f"after {name} (original weights back):", c2)
    return {f"{name}_perturbed_vs_hf": c1, f"{name}_restore_exact": c2}


def check_exact(api, served, before_tok, before_pl) -> dict:
    e2e = _e2e()
    tok, _ = e2e.greedy(api, served)
    pl = e2e.vllm_prompt_logprobs(api, served, e2e.PROMPT + list(before_tok))
    d = max(abs(x - y) for x, y in zip(pl, before_pl))
    return dict(ok=tok == before_tok and d <= 1e-4, greedy_equal=tok == before_tok,
                prompt_logprob_max_abs_diff=d)


def run(a) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    e2e = _e2e()
    res: dict = dict(label=a.label, checks={}, variants={}, errors=[])
    torch.cuda.set_device(0)
    t = time.perf_counter()  # load while vLLM starts
    hf = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.bfloat16).to("cuda").eval()
    res["hf_load_s"] = round(time.perf_counter() - t, 1)
    api = e2e.Api(a.url)
    e2e.wait_health(api, a.health_timeout, a.vllm_pid)
    res["vllm_version"] = api.get("/version")["version"]
    served = api.get("/v1/models")["data"][0]["id"]
    params = list(hf.named_parameters())
    res.update(params_M=round(sum(p.numel() for _, p in params) / 1e6, 1), tensors=len(params),
               bytes=sum(p.numel() * p.element_size() for _, p in params), gpu=torch.cuda.get_device_name())
    before_tok, _ = e2e.greedy(api, served)
    c0, before_pl = e2e.compare(api, served, hf, before_tok, a.tol)
    res["checks"]["hf_vs_vllm_before"] = c0
    log("before:", c0)
    orig = [p.detach().clone() for _, p in params]
    torch.manual_seed(123)
    with torch.no_grad():
        for _, p in params:
            p.add_(a.perturb * torch.randn_like(p))
    pert = [p.detach().clone() for _, p in params]
    torch.cuda.synchronize()

    def load_hf(values) -> None:
        with torch.no_grad():
            for (_, p), o in zip(params, values):
                p.copy_(o)
        torch.cuda.synchronize()
    ws = import_weight_sync(a.ws)
    variants = a.variants.split(",")
    version = 1
    for v in variants:
        try:
            if v == "ours":
                res["variants"][v] = ours_rounds(ws, hf, a.url, "vllm", a.rounds, version)
                after_tok, _ = e2e.greedy(api, served)
                c1, _ = e2e.compare(api, served, hf, after_tok, a.tol)
                c1["greedy_changed"] = after_tok != before_tok
                c1["ok"] = c1["ok"] and c1["greedy_changed"]
                res["checks"]["ours_perturbed_vs_hf"] = c1
                log("after ours (perturbed weights):", c1)
            elif v == "helper":
                res["variants"][v] = helper_rounds(api, hf, a.port, a.rounds)
            elif v == "ours_store":
                load_hf(orig)
                res["variants"][v] = ours_rounds(ws, hf, a.url, "store", a.rounds, version)
                res["checks"]["ours_store_restore_exact"] = check_exact(api, served, before_tok, before_pl)
                log("after ours_store (original weights back):", res["checks"]["ours_store_restore_exact"])
            elif v in ("direct", "ipc"):
                res["checks"].update(direct_variant(a, api, served, hf, ws, version, load_hf, pert, orig,
                                                    before_tok, before_pl, res, name=v))
                version += 1
            version += a.rounds + 1
        except Exception as exc:  # noqa: BLE001
            traceback.print_exc()
            res["errors"].append(f"{v}: {exc!r}")
            break  # the server may hold a half-finished collective: later variants would hang
    res["ok"] = not res["errors"] and all(c.get("ok") for c in res["checks"].values())
    return res


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default="http://127.0.0.1:8011")
    ap.add_argument("--model")
    ap.add_argument("--label", default="model")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--variants", default="ours,helper,ours_store,direct")
    ap.add_argument("--port", type=int, default=29600, help="rendezvous port of the helper variant")
    ap.add_argument("--tol", type=float, default=0.25)
    ap.add_argument("--perturb", type=float, default=0.01,
                    help="std of the noise added to every weight (0.05 made deep random models too noisy in bf16)")
    ap.add_argument("--ws", help="folder holding a weight_sync package to use instead of the repo's")
    ap.add_argument("--health-timeout", type=float, default=300)
    ap.add_argument("--vllm-pid", type=int)
    ap.add_argument("--results")
    ap.add_argument("--table")
    ap.add_argument("--floor", help="floor.jsonl from gpu_nccl_floor.py, for the table")
    a = ap.parse_args()
    if a.table:
        return print_table(a.table, a.floor)
    try:
        res = run(a)
    except Exception as exc:  # noqa: BLE001
        traceback.print_exc()
        res = dict(label=a.label, ok=False, errors=[repr(exc)], variants={}, checks={})
    log("RESULT", json.dumps(res))
    if a.results:
        with open(a.results, "a") as f:
            f.write(json.dumps(res) + "\n")
    return 0 if res["ok"] else 1


COLS = [("pause_to_resume_ms", "p2r"), ("prepare_ms", "gather"), ("pause_ms", "pause"),
        ("start_ms", "start"), ("nccl_broadcast_ms", "pack+bcast"), ("nccl_server_ms", "upd(http)"), ("send_ms", "send"),
        ("update_ms", "update"), ("ext_load_ms", "ext load"), ("finish_ms", "finish"), ("reset_prefix_cache_ms", "reset"),
        ("resume_ms", "resume")]


def summarise(rows: list[dict]) -> dict:
    """Median over the timed rounds (warm-up excluded), per column."""
    timed = [r for r in rows if r.get("round") != "warmup"] or rows
    out = {}
    for key, _ in COLS:
        vals = [r[key] for r in timed if isinstance(r.get(key), (int, float))]
        if vals:
            out[key] = round(statistics.median(vals), 1)
    p2r = [r["pause_to_resume_ms"] for r in timed]
    out["p2r_min"], out["p2r_max"] = round(min(p2r), 1), round(max(p2r), 1)
    return out


def print_table(path: str, floor_path: str | None) -> int:
    floors = {}
    if floor_path and Path(floor_path).exists():
        floors = {json.loads(x)["label"]: json.loads(x) for x in Path(floor_path).read_text().splitlines() if x.strip()}
    rows = [json.loads(x) for x in Path(path).read_text().splitlines() if x.strip()]
    head = f"{'model':<12}{'MiB':>8}{'variant':>12}" + "".join(f"{n:>11}" for _, n in COLS) + \
        f"{'p2r range':>16}{'floor':>8}{'p2r/floor':>10}  ok"
    print("median ms over timed rounds (warm-up excluded); p2r = pause -> resume")
    print(head)
    for r in rows:
        fl = floors.get(r["label"], {}).get("floor_ms")
        for v, rounds in r.get("variants", {}).items():
            s = summarise(rounds)
            cells = "".join(f"{s.get(k, '-')!s:>11}" for k, _ in COLS)
            ratio = f"{s['pause_to_resume_ms'] / fl:.1f}x" if fl else "-"
            print(f"{r['label']:<12}{r.get('bytes', 0) / 2**20:>8.0f}{v:>12}{cells}"
                  f"{s['p2r_min']:>8}-{s['p2r_max']:<7}{fl if fl else '-'!s:>8}{ratio:>10}  {r.get('ok')}")
        if r.get("errors"):
            print(f"{r['label']:<12}errors: {r['errors']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
