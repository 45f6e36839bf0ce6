"""Helpers for trainer tests: config factory, a PushSamples client over a real socket,
HF-side greedy decoding, restoring the shared vLLM server's weights, fixed model limits."""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass

from agrpo.services.common.config import AgrpoConfig


def make_cfg(model_dir, output_dir, urls, **over) -> AgrpoConfig:
    trainer = {"port": 0, "metrics_port": None, "max_samples_per_micro_batch": 4, "idle_flush_s": 0.5,
               "reconcile_interval_s": 2.0, **over.pop("trainer", {})}
    raw = {"model": str(model_dir), "output_dir": str(output_dir), "vllm_server_base_urls": list(urls),
           "learning_rate": 1e-3, "max_steps": 1, "per_device_train_batch_size": 4, "save_strategy": "no",
           "max_staleness": 2, "queue_maxsize": 16, "vllm_server_timeout": 60, "weight_sync_phase_timeout": 30,
           "log_format": "text", "trainer": trainer}
    raw.update(over)
    return AgrpoConfig.model_validate(raw)


def rollout_samples(n_groups: int, size: int, *, version: int, seed: int = 0, epoch: int = 0,
                    start_index: int = 0, prefix: str = "s"):
    """RolloutSample protos: groups sharing a prompt, with plausible behaviour logprobs."""
    from agrpo.v1 import common_pb2

    rng = random.Random(seed)
    out = []
    for g in range(n_groups):
        prompt = [rng.randrange(3, 1000) for _ in range(6)]
        for k in range(size):
            comp = [rng.randrange(3, 1000) for _ in range(rng.randrange(3, 7))]
            ids = prompt + comp
            mask = [0] * len(prompt) + [1] * len(comp)
            out.append(common_pb2.RolloutSample(
                sample_id=f"{prefix}-{epoch}-{start_index + g}-{k}", group_id=f"{prefix}-g{start_index + g}",
                prompt_key=common_pb2.PromptKey(dataset_index=start_index + g, epoch=epoch),
                policy_version=version, input_ids=ids, completion_mask=mask,
                behavior_logprobs=[-rng.uniform(4, 8) if m else 0.0 for m in mask],
                advantage=rng.uniform(-1, 1), reward=rng.random(), prompt_length=len(prompt),
                generation_index=k))
    return out


class Producer:
    """A PushSamples client over a real gRPC channel: sends, then collects acks."""

    def __init__(self, port: int, producer_id: str = "producer-1", prompts_per_epoch: int = 0) -> None:
        from agrpo.services.common.channels import open_channel
        from agrpo.v1 import trainer_service_pb2 as trainer_pb
        from agrpo.v1 import trainer_service_pb2_grpc as trainer_grpc

        self.pb = trainer_pb
        self.channel = open_channel(f"127.0.0.1:{port}", ["agrpo.v1.TrainerService"])
        self.stub = trainer_grpc.TrainerServiceStub(self.channel)
        self.outgoing: asyncio.Queue = asyncio.Queue()
        self.outgoing.put_nowait(trainer_pb.PushSamplesRequest(
            hello=trainer_pb.PushSamplesHello(producer_id=producer_id, prompts_per_epoch=prompts_per_epoch)))
        self.acks: dict[str, list[int]] = {}
        self.reasons: dict[str, str] = {}
        self.credits = 0
        self.first = None
        self.done = False
        self._call = self.stub.PushSamples(self._requests())
        self._reader = asyncio.create_task(self._read())

    async def _requests(self):
        while True:
            msg = await self.outgoing.get()
            if msg is None:
                return
            yield msg

    async def _read(self):
        async for resp in self._call:
            if self.first is None:
                self.first = resp
            self.credits += resp.credits
            self.done = self.done or resp.done
            for ack in resp.acks:
                self.acks.setdefault(ack.sample_id, []).append(ack.outcome)
                if ack.reason:
                    self.reasons[ack.sample_id] = ack.reason

    async def send(self, samples) -> None:
        for s in samples:
            await self.wait_for(lambda: self.credits > 0)
            self.credits -= 1
            self.outgoing.put_nowait(self.pb.PushSamplesRequest(sample=s))

    async def wait_for(self, cond, timeout: float = 120.0) -> None:
        deadline = asyncio.get_running_loop().time() + timeout
        while not cond():
            if self._reader.done():
                self._reader.result()
                raise AssertionError("stream ended before the condition held")
            if asyncio.get_running_loop().time() > deadline:
                raise TimeoutError(f"condition not met; acks={self.acks}")
            await asyncio.sleep(0.05)

    def final(self, sample_id: str) -> int | None:
        outcomes = self.acks.get(sample_id, [])
        return outcomes[-1] if outcomes else None

    async def close(self) -> None:
        self.outgoing.put_nowait(None)
        self._reader.cancel()
        await asyncio.gather(self._reader, return_exceptions=True)
        await self.channel.close()


def greedy(model, prompt: list[int], n: int = 12) -> list[int]:
    """Greedy continuation with full forwards (no KV cache): the reference for vLLM parity."""
    import torch

    ids = list(prompt)
    was_training = model.training
    model.eval()
    with torch.no_grad():
        for _ in range(n):
            logits = model(input_ids=torch.tensor([ids]), use_cache=False).logits[0, -1]
            ids.append(int(logits.argmax()))
    model.train(was_training)
    return ids[len(prompt):]


def vllm_greedy(server, prompt: list[int], n: int = 12) -> list[int]:
    r = server.post_json("/v1/completions", {"model": server.model_name, "prompt": prompt, "max_tokens": n,
                                              "temperature": 0.0, "return_token_ids": True, "ignore_eos": True})
    return r["choices"][0]["token_ids"]


def restore_server(server, model_dir) -> None:
    """Put the shared server back on the seed weights with vLLM's initial label."""
    for path, body in (("/pause?mode=keep", None), ("/start_weight_update", {"is_checkpoint_format": True}),
                       ("/update_weights", {"update_info": {"path": str(model_dir)}}),
                       ("/finish_weight_update", {"weight_version": "default"}),
                       ("/reset_prefix_cache", None), ("/resume", None)):
        server.post_json(path, body)


@dataclass
class Limits:
    """ModelLimits (services/trainer/intake.py) of a model that is not loaded: fixed numbers."""

    tokens: int | None = None
    vocab: int | None = None

    def token_budget(self) -> int | None:
        return self.tokens

    def vocab_size(self) -> int | None:
        return self.vocab
