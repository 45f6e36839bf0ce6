# syntax=docker/dockerfile:1
# agrpo trainer image. Build from the repository root:
#   docker build -f deploy/docker/trainer.Dockerfile -t agrpo/trainer:dev .
# CPU torch by default; for a GPU node build with the CUDA wheels from PyPI:
#   --build-arg TORCH_INDEX_URL=https://pypi.org/simple
# Pin BASE_IMAGE by digest in production (python:3.11-slim-bookworm@sha256:...).
ARG BASE_IMAGE=python:3.11-slim-bookworm

FROM ${BASE_IMAGE} AS build
ARG TORCH_SPEC=torch==2.13.0
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
# Optional folder or URL of local wheels (air-gapped builds: a torch +cpu wheel).
ARG PIP_FIND_LINKS=
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
# torch first and pinned: an unpinned torch pulls whatever CUDA build PyPI has today.
RUN pip install --index-url "${TORCH_INDEX_URL}" "${TORCH_SPEC}"
# Dependencies before sources, so code edits keep this layer cached.
COPY pyproject.toml README.md /src/
# The common dependencies plus this service's extra ([project.optional-dependencies] trainer).
RUN python -c "import tomllib; p = tomllib.load(open('/src/pyproject.toml','rb'))['project']; \
print('\n'.join(p['dependencies'] + p['optional-dependencies']['trainer']))" \
        > /tmp/requirements.txt \
 && pip install -r /tmp/requirements.txt "${TORCH_SPEC}" --extra-index-url "${TORCH_INDEX_URL}"
COPY services /src/services
COPY gen /src/gen
RUN pip install --no-deps /src

FROM ${BASE_IMAGE}
ENV PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 \
    HOME=/tmp HF_HOME=/tmp/hf HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 \
    OMP_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false AGRPO_CONFIG=/etc/agrpo/agrpo.yaml
RUN groupadd --system --gid 10001 agrpo \
 && useradd --system --uid 10001 --gid agrpo --home-dir /nonexistent --shell /usr/sbin/nologin agrpo \
 && install -d -o agrpo -g agrpo /var/lib/agrpo /assets
COPY --from=build /opt/venv /opt/venv
COPY deploy/docker/grpc_health_probe.py deploy/docker/make_assets.py /opt/agrpo/
# Our vLLM worker extension (pure Python): the GPU overlay copies it into the vLLM pod
# with an init container, for the direct weight load (docs/gpu.md).
COPY vllm_plugin/agrpo_vllm_plugin /opt/agrpo/vllm_plugin/agrpo_vllm_plugin
USER 10001:10001
WORKDIR /var/lib/agrpo
VOLUME ["/var/lib/agrpo"]
EXPOSE 50051 9101
# start-period covers model load and the cold weight sync into vLLM.
HEALTHCHECK --interval=15s --timeout=5s --start-period=600s --retries=3 \
    CMD ["python", "/opt/agrpo/grpc_health_probe.py", "127.0.0.1:50051"]
ENTRYPOINT ["agrpo"]
CMD ["trainer", "--config", "/etc/agrpo/agrpo.yaml"]
