# syntax=docker/dockerfile:1
# agrpo rollout (generation client; no torch: vLLM generates) image. Build from the repository root:
#   docker build -f deploy/docker/rollout.Dockerfile -t agrpo/rollout:dev .
# Pin BASE_IMAGE by digest in production (python:3.11-slim-bookworm@sha256:...).
ARG BASE_IMAGE=python:3.11-slim-bookworm

FROM ${BASE_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
# Dependencies before sources, so code edits keep this layer cached.
COPY pyproject.toml README.md /src/
# The common dependencies plus this service's extra ([project.optional-dependencies] rollout).
RUN python -c "import tomllib; p = tomllib.load(open('/src/pyproject.toml','rb'))['project']; \
print('\n'.join(p['dependencies'] + p['optional-dependencies']['rollout']))" \
        > /tmp/requirements.txt \
 && pip install -r /tmp/requirements.txt jinja2
# jinja2: transformers' chat templates need it; the project venv gets it through torch,
# which this image does not install.
COPY services /src/services
COPY gen /src/gen
RUN pip install --no-deps /src

FROM ${BASE_IMAGE}
ENV PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 \
    HOME=/tmp HF_HOME=/tmp/hf HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 \
    OMP_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false AGRPO_CONFIG=/etc/agrpo/agrpo.yaml
RUN groupadd --system --gid 10001 agrpo \
 && useradd --system --uid 10001 --gid agrpo --home-dir /nonexistent --shell /usr/sbin/nologin agrpo
COPY --from=build /opt/venv /opt/venv
COPY deploy/docker/grpc_health_probe.py /opt/agrpo/
USER 10001:10001
WORKDIR /tmp
EXPOSE 50052 9102
HEALTHCHECK --interval=15s --timeout=5s --start-period=120s --retries=3 \
    CMD ["python", "/opt/agrpo/grpc_health_probe.py", "127.0.0.1:50052"]
ENTRYPOINT ["agrpo"]
CMD ["rollout", "--config", "/etc/agrpo/agrpo.yaml"]
