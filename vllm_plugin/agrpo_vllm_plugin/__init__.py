"""vLLM general plugin: the ``cpu_http`` weight-transfer backend, and the one-call weight
swap in the engine core (``agrpo_swap``, swap.py).

Why: every weight-transfer backend built into vLLM (nccl, ipc, ...) needs CUDA,
so on a CPU-only machine the official RL flow (``/init_weight_transfer_engine`` ->
``/start_weight_update`` -> ``/update_weights`` -> ``/finish_weight_update``)
has no backend to run on. This plugin supplies one that takes the weights in the
HTTP request body itself (base64 safetensors) or as a path on the local disk.

vLLM calls :func:`register` in every one of its processes, so it must be cheap
and idempotent; the engine module (which imports torch and vLLM internals) is
only imported when a server is actually configured with this backend.
"""

BACKEND_NAME = "cpu_http"


def register() -> None:
    """Register ``cpu_http`` with vLLM's weight-transfer factory (lazily) and install the swap."""
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

    from .swap import install

    install()

    # Plugins can be loaded more than once per process and the factory raises on
    # duplicate names, so check first.
    if BACKEND_NAME in WeightTransferEngineFactory._registry:
        return
    WeightTransferEngineFactory.register_engine(
        BACKEND_NAME, "agrpo_vllm_plugin.engine", "CpuHttpWeightTransferEngine"
    )
