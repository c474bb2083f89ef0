"""Entry point of `make dist-binary` (PyInstaller --onefile): the `tally` command, whose
`serve` runs gunicorn in this process, so the binary needs no Python on the server."""

import sys

from cli import main

if __name__ == "__main__":
    sys.exit(main())
