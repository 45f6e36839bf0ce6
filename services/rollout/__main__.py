"""`python -m agrpo.services.rollout [--config FILE] [--key value ...]` == `agrpo rollout ...`."""

import sys

from agrpo.services.common.entry import run_service

if __name__ == "__main__":
    sys.exit(run_service("rollout", sys.argv[1:]))
