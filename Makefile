# The two commands a newcomer needs are `make test` (this file) and the demo (README).
# Both create what they need when missing (scripts/setup_env.sh is idempotent).
PY := .venv/bin/python
# 2-core machines: one OpenMP thread per process, or torch oversubscribes (45x slower).
export OMP_NUM_THREADS ?= 1
export HF_HUB_OFFLINE := 1
export HF_DATASETS_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: setup test demo protos lint-protos

setup:
	bash scripts/setup_env.sh

test: setup
	$(PY) -m pytest -q

demo: setup
	.venv/bin/agrpo demo $(DEMO_ARGS)

protos: setup
	$(PY) scripts/gen_protos.py

lint-demo: setup
	.venv/bin/agrpo demo $(DEMO_ARGS)

protos: setup
	bash scripts/setup_env.sh tools && .cache/tools/node_modules/.bin/buf lint
