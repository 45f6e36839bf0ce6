"""`python -m agrpo.services.rollout [--config FILE] [--key value ...]` == `agrpo rollout ...`."""

import sys

from agrpo.cli import main

if __name__ == "__main__":
    sys.exit(main(["rollout", *sys.argv[1:]]))
