"""`python -m agrpo.services.trainer [--config FILE] [--key value ...]` (same as `agrpo trainer`)."""

import sys

from agrpo.cli import main

if __name__ == "__main__":
    sys.exit(main(["trainer", *sys.argv[1:]]))
