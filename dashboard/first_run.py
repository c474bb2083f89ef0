"""The first run's setup link: where it points, and the one line that announces it.

Pure: `tally serve`'s master (gunicorn.conf.py on_starting) and `tally setup-link` make the
token (storage.people) and print what this module builds.
"""

from __future__ import annotations

import socket

DEFAULT_BIND = "127.0.0.1:8000"


def origin(public_url: str, bind: str | None) -> str:
    """TALLY_PUBLIC_URL when it is set; else http:// and the address the server binds
    (a wildcard address becomes this machine's name, a Unix socket localhost)."""
    if public_url:
        return public_url.rstrip("/")
    bind = bind or DEFAULT_BIND
    if bind.startswith(("unix:", "fd://")):
        return "http://localhost"
    host, _, port = bind.rpartition(":")
    if not host:
        host, port = port, "8000"
    if host in ("0.0.0.0", "::", "[::]", ""):
        host = socket.gethostname() or "localhost"
    elif ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"http://{host}" + ("" if port == "80" else f":{port}")


def setup_url(public_url: str, bind: str | None, token: str) -> str:
    return f"{origin(public_url, bind)}/setup/{token}"


def setup_line(url: str) -> str:
    return (f"tally: no user yet. Open {url} within 24 hours to create the owner and the first "
            "site (tally setup-link prints a new link).")
