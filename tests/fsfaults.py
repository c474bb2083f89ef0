"""Real filesystem faults for tests: a tiny filesystem (disk full) and read-only files.

Both need mount(2), so they work as root (containers, CI runners) and skip elsewhere;
a non-root user gets a read-only file from chmod instead.
"""

from __future__ import annotations

import os
import subprocess
from contextlib import contextmanager
from pathlib import Path

import pytest


def _mount(*args: str) -> None:
    proc = subprocess.run(["mount", *args], capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount here ({proc.stderr.strip() or 'mount failed'})")


def _umount(path: Path) -> None:
    subprocess.run(["umount", "-l", str(path)], capture_output=True)


@contextmanager
def tiny_filesystem(folder: Path, size_kib: int):
    """A tmpfs of `size_kib` KiB mounted on `folder`; ENOSPC once it is full."""
    if os.geteuid() != 0:
        pytest.skip("a tiny filesystem needs root to mount")
    folder.mkdir(parents=True, exist_ok=True)
    _mount("-t", "tmpfs", "-o", f"size={size_kib}k,mode=0777", "tmpfs", str(folder))
    try:
        yield folder
    finally:
        _umount(folder)


@contextmanager
def read_only(path: Path):
    """Make an existing file or folder read-only for this process, even as root."""
    if os.geteuid() != 0:
        mode = path.stat().st_mode
        path.chmod(0o555 if path.is_dir() else 0o444)
        try:
            yield path
        finally:
            path.chmod(mode)
        return
    _mount("--bind", str(path), str(path))
    try:
        _mount("-o", "remount,bind,ro", str(path))
        yield path
    finally:
        _umount(path)


def fill(folder: Path, name: str = "filler") -> Path:
    """Write zeros into `folder` until its filesystem is full; delete the file to free it."""
    filler = folder / name
    block = b"\0" * 4096
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        while True:
            os.write(fd, block)
    except OSError:
        pass
    finally:
        os.close(fd)
    return filler
