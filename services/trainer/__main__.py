"""`python -m agrpo.services.trainer [--config FILE] [--key value ...]` (same as `agrpo trainer`)."""

import sys

from agrpo.services.common.entry import run_service

if __name__ == "__main__":
    sys.exit(run_service("trainer", sys.argv[1:]))
