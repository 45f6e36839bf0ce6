# The two commands a newcomer needs are `make test` (this file) and the demo (README).
# Both create what they need when missing (scripts/setup_env.sh is idempotent).
PY := .venv/bin/python
# 2-core machines: one OpenMP thread per process, or torch oversubscribes (45x slower).
export OMP_NUM_THREADS ?= 1
export HF_HUB_OFFLINE := 1
export HF_DATASETS_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: setup test test-unit lint demo protos lint-protos

setup:
	bash scripts/setup_env.sh

# Everything CI runs: the lint, then the whole suite (real vLLM, real processes).
test: lint
	$(PY) -m pytest -q

# The fast subset: unit tests that need no vLLM server (about a minute on 2 cores).
test-unit: setup
	$(PY) -m pytest -q tests/unit -m "not vllm and not slow"

# Type-checked (mypy, pyproject [tool.mypy]): the launcher and every service (agrpo.services:
# common, reward, rollout, trainer). What these import outside the scope is read for types but
# its errors are not reported; torch, vLLM, grpc and the like are not analysed (Any).
MYPY_SCOPE := agrpo.launcher agrpo.services

lint: setup
	$(PY) -m ruff check .
	$(PY) -m mypy $(addprefix -p ,$(MYPY_SCOPE))

demo: setup
	.venv/bin/agrpo demo $(DEMO_ARGS)

# Regenerate agrpo/v1/ from protos/ (a test fails when the two drift apart).
protos: setup
	$(PY) scripts/gen_protos.py

lint-protos: setup
	.cache/tools/node_modules/.bin/buf lint
