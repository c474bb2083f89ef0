"""Which address a request came from, when trusted proxies may stand in front.

Pure and standalone (standard library only), so a client library can apply the same
rule: the connection's address, unless that is a trusted proxy; then the right-most
address of X-Forwarded-For that is not a trusted proxy. Addresses left of it were
written by the client itself and prove nothing.
"""

from __future__ import annotations

import ipaddress

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def _address(text: str):
    """An address from a peer or an X-Forwarded-For entry; None when it is not one.

    Takes "[v6]:port" and "v4:port" as proxies sometimes write them, and reads an
    IPv4-mapped IPv6 address as the IPv4 address it carries."""
    text = text.strip()
    if text.startswith("["):
        text = text[1:text.find("]")] if "]" in text else text
    elif text.count(":") == 1:
        text = text.split(":", 1)[0]
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return None
    if address.version == 6 and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def _trusted(address, networks: tuple[Network, ...]) -> bool:
    return any(address.version == net.version and address in net for net in networks)


def client_ip(peer: str, forwarded_for: str | None, trusted: tuple[Network, ...]) -> str | None:
    """The client's address as text, or None when even the peer is not an address."""
    address = _address(peer or "")
    if address is None:
        return None
    if not forwarded_for or not _trusted(address, trusted):
        return str(address)
    for entry in reversed(forwarded_for.split(",")):
        hop = _address(entry)
        if hop is None:
            break  # garbage: nothing to its left can be believed; keep the last proxy
        address = hop
        if not _trusted(hop, trusted):
            break
    return str(address)


def address_block(address: str) -> str:
    """The block one client is counted as: an IPv4 address itself, an IPv6 address's /64.

    One IPv6 subscriber is handed a whole /64 (often a /56 or /48), so counting single
    IPv6 addresses would give each client 2**64 allowances."""
    try:
        parsed = ipaddress.ip_address(address)
    except ValueError:
        return address
    if parsed.version == 4:
        return str(parsed)
    return str(ipaddress.IPv6Network((int(parsed) >> 64 << 64, 64)))
