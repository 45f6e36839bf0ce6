# syntax=docker/dockerfile:1
# agrpo trainer image, built from the agrpo wheel. From the repository root:
#   .venv/bin/pip wheel --no-deps -w dist .      # dist/agrpo-<version>-py3-none-any.whl
#   docker build -f deploy/docker/trainer.Dockerfile -t agrpo/trainer:dev .
# CPU torch by default; for a GPU node build with the CUDA wheels from PyPI:
#   --build-arg TORCH_INDEX_URL=https://pypi.org/simple
# Pin BASE_IMAGE by digest in production (python:3.11-slim-bookworm@sha256:...).
ARG BASE_IMAGE=python:3.11-slim-bookworm

FROM ${BASE_IMAGE} AS build
# The steps up to and with torch's are the same in vllm-cpu.Dockerfile, so a machine that
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
# Dependencies before the wheel, so a code change rebuilds only the wheel's layer.
COPY pyproject.toml /src/
RUN python -c "import tomllib; p = tomllib.load(open('/src/pyproject.toml', 'rb'))['project']; \
print('\n'.join(p['dependencies']))" > /tmp/common.txt \
 && pip install -r /tmp/common.txt
# This service's extra ([project.optional-dependencies] trainer), torch held at its pin.
RUN python -c "import tomllib; p = tomllib.load(open('/src/pyproject.toml', 'rb'))['project']; \
print('\n'.join(p['optional-dependencies']['trainer']))" > /tmp/extra.txt \
 && pip install -r /tmp/extra.txt "${TORCH_SPEC}" --extra-index-url "${TORCH_INDEX_URL}"
# The wheel, with its extra: pip finds every dependency already there.
COPY dist/agrpo-*-py3-none-any.whl /src/dist/
RUN set -- /src/dist/agrpo-*-py3-none-any.whl; \
    if [ "$#" -ne 1 ]; then echo "dist/ must hold exactly one agrpo wheel, not: $*" >&2; exit 1; fi; \
    pip install "$1[trainer]" "${TORCH_SPEC}" --extra-index-url "${TORCH_INDEX_URL}" \
 && python -c "import agrpo.services.trainer.server"

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
