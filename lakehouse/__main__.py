"""`python -m lakehouse`: the `lakehouse` command (lakehouse._entry)."""

import sys

from lakehouse._entry import main

if __name__ == "__main__":
    sys.exit(main())
