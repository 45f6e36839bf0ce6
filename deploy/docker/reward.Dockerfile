# syntax=docker/dockerfile:1
# agrpo reward (CPU only, slim: no torch) image, built from the agrpo wheel. From the
# repository root:
#   .venv/bin/pip wheel --no-deps -w dist .      # dist/agrpo-<version>-py3-none-any.whl
#   docker build -f deploy/docker/reward.Dockerfile -t agrpo/reward:dev .
# Pin BASE_IMAGE by digest in production (python:3.11-slim-bookworm@sha256:...).
ARG BASE_IMAGE=python:3.11-slim-bookworm

FROM ${BASE_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
# Dependencies before the wheel, so a code change rebuilds only the wheel's layer. These two
# steps are the same in the reward, rollout and trainer Dockerfiles: the build cache shares
# the common dependencies' layer between reward and rollout.
COPY pyproject.toml /src/
RUN python -c "import tomllib; p = tomllib.load(open('/src/pyproject.toml', 'rb'))['project']; \
print('\n'.join(p['dependencies']))" > /tmp/common.txt \
 && pip install -r /tmp/common.txt
# This service's extra ([project.optional-dependencies] reward).
RUN python -c "import tomllib; p = tomllib.load(open('/src/pyproject.toml', 'rb'))['project']; \
print('\n'.join(p['optional-dependencies']['reward']))" > /tmp/extra.txt \
 && pip install -r /tmp/extra.txt
# The wheel, with its extra: pip finds every dependency already there.
COPY dist/agrpo-*-py3-none-any.whl /src/dist/
RUN set -- /src/dist/agrpo-*-py3-none-any.whl; \
    if [ "$#" -ne 1 ]; then echo "dist/ must hold exactly one agrpo wheel, not: $*" >&2; exit 1; fi; \
    pip install "$1[reward]" && python -c "import agrpo.services.reward.server"

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
EXPOSE 50053 9103
HEALTHCHECK --interval=15s --timeout=5s --start-period=120s --retries=3 \
    CMD ["python", "/opt/agrpo/grpc_health_probe.py", "127.0.0.1:50053"]
ENTRYPOINT ["agrpo"]
CMD ["reward", "--config", "/etc/agrpo/agrpo.yaml"]
