"""``python -m twinkle``: the ``twinkle`` command, for an environment whose scripts
folder is not on ``PATH``."""

import sys

from twinkle.cli import main

if __name__ == "__main__":
    sys.exit(main())
