"""Entry point of `make dist-binary` (PyInstaller --onefile): the `tally` command, whose
`serve` runs gunicorn in this process, so the binary needs no Python on the server."""

import sys

from cli import main

if __name__ == "__main__":
    from storage.read_processes import FROZEN_ARGUMENT, serve

    if sys.argv[1:] == [FROZEN_ARGUMENT]:  # a read process of the server (no `python -c`)
        sys.exit(serve())
    sys.exit(main())
