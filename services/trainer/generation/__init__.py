"""The trainer serves generation itself (weight_transport local): no vLLM, no weights in flight.

For a CPU machine, where starting vLLM costs more than a small job's whole training and its
per-step overhead more than a small model's decode: the trainer keeps a copy of its model for
generation, refreshed when a version is published (a memory copy), and answers rollout on the
subset of vLLM's HTTP API rollout uses (token ids in and out, processed logprobs, weight-version
spans). See generator.py for the batching, server.py for the routes.
"""
