#!/usr/bin/env bash
# run_gpu_tests.sh: the GPU tests (tests/gpu) on a GPU box, from anywhere in the repo.
# 2 GPUs run all of them; 1 GPU runs the single-GPU ones (the rest skip). CPU CI skips them all.
# Extra arguments go to pytest, e.g. -k fsdp2. The NCCL tests need the trainer's NcclLib (docs/gpu.md).
set -uo pipefail
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 \
       NCCL_CUMEM_ENABLE=0 PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH}
# --confcutdir: tests/conftest.py (vLLM-on-CPU session fixtures) is not needed here
exec python3 -m pytest tests/gpu -q -rs -p no:cacheprovider --confcutdir=tests/gpu "$@"
