"""`python -m services.trainer [--config FILE] [--key value ...]` (same as `agrpo trainer`)."""

import sys

from services.cli import main

if __name__ == "__main__":
    sys.exit(main(["trainer", *sys.argv[1:]]))
