"""Helpers for web frameworks: the visitor's real IP, the browser script's visitor id, and
the identity hash a page passes to `tally('identify', ...)`.

Both take what a framework hands you: a WSGI environ, Django's `request.META`, or a
request object of Flask/Werkzeug, Django, Falcon, Starlette/FastAPI or WebOb.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import re
from collections.abc import Iterable, Mapping
from http.cookies import CookieError, SimpleCookie

LOOPBACK = ("127.0.0.0/8", "::1/128")
VISITOR_COOKIE = "tally_vid"
# What the browser script writes (and the server accepts as customer.visitor_id): 32
# lower-case hex digits, 128 random bits, after `dddd.` (the UTC day the cookie was made,
# 4 hex digits) in cookies written since the script dated them.
_VISITOR_ID = re.compile(r"(?:[0-9a-f]{4}\.)?[0-9a-f]{32}")


def _address(text: str | None):
    if not text:
        return None
    text = text.strip()
    if text.startswith("[") and "]" in text:  # "[::1]:8080" as some proxies write it
        text = text[1:text.index("]")]
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return None
    mapped = getattr(address, "ipv4_mapped", None)
    return mapped or address


def _networks(trusted: Iterable[str] | str):
    items = [trusted] if isinstance(trusted, str) else list(trusted)
    return [ipaddress.ip_network(item.strip(), strict=False) for item in items if item.strip()]


def _peer_and_forwarded(source) -> tuple[str | None, str | None]:
    """(the connection's address, the X-Forwarded-For header) of any supported request."""
    if isinstance(source, Mapping):  # a WSGI environ, or Django's request.META
        return source.get("REMOTE_ADDR"), source.get("HTTP_X_FORWARDED_FOR")
    for attribute in ("environ", "env", "META"):  # Werkzeug/WebOb, Falcon, Django
        environ = getattr(source, attribute, None)
        if isinstance(environ, Mapping):
            return environ.get("REMOTE_ADDR"), environ.get("HTTP_X_FORWARDED_FOR")
    scope = getattr(source, "scope", None)  # Starlette / FastAPI (ASGI)
    if isinstance(scope, Mapping):
        client = scope.get("client")
        forwarded = None
        for name, value in scope.get("headers") or ():
            if name.lower() == b"x-forwarded-for":
                forwarded = value.decode("latin-1")
        return (client[0] if client else None), forwarded
    raise TypeError(f"client_ip() does not know how to read a {type(source).__name__}")


def client_ip(source, trusted_proxies: Iterable[str] | str = LOOPBACK) -> str | None:
    """The visitor's IP address, as Tally's own collect endpoint finds it.

    The connection's address, unless it is a trusted proxy (addresses or CIDRs; loopback by
    default): then the right-most address in X-Forwarded-For that is not a trusted proxy.
    Left of that, anyone could have written the header, so it is never believed."""
    peer_text, forwarded = _peer_and_forwarded(source)
    peer = _address(peer_text)
    if peer is None:
        return None
    networks = _networks(trusted_proxies)

    def trusted(address) -> bool:
        return any(address.version == net.version and address in net for net in networks)

    if not trusted(peer):
        return str(peer)
    candidate = peer
    for part in reversed((forwarded or "").split(",")):
        address = _address(part)
        if address is None:
            break
        candidate = address
        if not trusted(address):
            break
    return str(candidate)


def visitor_id_from_cookies(source) -> str | None:
    """The browser script's visitor id (cookie `tally_vid`), or None.

    `source` is a mapping of cookies (`request.cookies`, `request.COOKIES`), a `Cookie`
    header, a WSGI environ, or a request object. Put the result into Stripe metadata as
    `tally_visitor_id`, or into a payment's `customer.visitor_id`."""
    value = None
    if isinstance(source, str):
        value = _from_header(source)
    elif isinstance(source, Mapping):
        if "HTTP_COOKIE" in source or "REMOTE_ADDR" in source:
            value = _from_header(source.get("HTTP_COOKIE", ""))
        else:
            value = source.get(VISITOR_COOKIE)
    else:
        for attribute in ("cookies", "COOKIES"):
            cookies = getattr(source, attribute, None)
            if isinstance(cookies, Mapping):
                value = cookies.get(VISITOR_COOKIE)
                break
        else:
            for attribute in ("environ", "env", "META"):
                environ = getattr(source, attribute, None)
                if isinstance(environ, Mapping):
                    value = _from_header(environ.get("HTTP_COOKIE", ""))
                    break
    if isinstance(value, str) and _VISITOR_ID.fullmatch(value):
        return value
    return None


def _from_header(header: str) -> str | None:
    cookie = SimpleCookie()
    try:
        cookie.load(header or "")
    except CookieError:
        return None
    morsel = cookie.get(VISITOR_COOKIE)
    return morsel.value if morsel is not None else None


def identity_hash(secret: str, user_id: str) -> str:
    """The hash that makes the browser's identify count: put it in the page of a signed-in
    user, `tally('identify', USER_ID, {hash: HASH})`. `secret` is the site's identity
    secret (`tally site identity-secret`), which stays on your server: lower-case hex
    HMAC-SHA256 of the user id's UTF-8 bytes keyed with the secret's UTF-8 bytes."""
    return hmac.new(secret.encode("utf-8"), str(user_id).encode("utf-8"),
                    hashlib.sha256).hexdigest()
