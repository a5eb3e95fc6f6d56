"""How much of the internet a list of CIDRs opens: the union of the blocks, whatever the spelling.

`[0.0.0.0/1, 128.0.0.0/1]` opens as much as `0.0.0.0/0`; `[10.0.0.0/8]` opens nothing an internet client comes
from. Every public-exposure rule judges the addresses a list admits, never how it is written.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

# IPv4 ranges no internet client connects from: the IANA special-purpose registry's blocks that are not globally
# reachable (RFC 6890, https://www.iana.org/assignments/iana-ipv4-special-registry/), multicast (RFC 5771) and the
# reserved 240.0.0.0/4 (RFC 1112) that holds the limited broadcast address.
NOT_INTERNET = tuple(ipaddress.IPv4Network(n) for n in (
    "0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16", "172.16.0.0/12", "192.0.0.0/24",
    "192.0.2.0/24", "192.168.0.0/16", "198.18.0.0/15", "198.51.100.0/24", "203.0.113.0/24", "224.0.0.0/4",
    "240.0.0.0/4"))
INTERNET_ADDRESSES = 2**32 - sum(n.num_addresses for n in NOT_INTERNET)
# More than a /8's worth of internet addresses (the largest block IANA ever assigned one organisation) is no
# allow-list of someone's egress addresses: it opens the endpoint to anyone, whatever the list says.
ANYONE = 2**24


def internet_addresses(cidrs: Iterable[str]) -> int:
    """Internet addresses the union of `cidrs` admits (overlaps and duplicates counted once)."""
    union = list(ipaddress.collapse_addresses(ipaddress.IPv4Network(c) for c in cidrs))
    total = 0
    for net in union:
        # Two CIDR blocks either nest or are disjoint, so each reserved block is inside `net`, holds it, or misses it.
        hidden = sum(min(r, net, key=lambda n: n.num_addresses).num_addresses for r in NOT_INTERNET
                     if r.overlaps(net))
        total += net.num_addresses - hidden
    return total


def opens_to_anyone(cidrs: Iterable[str]) -> bool:
    return internet_addresses(cidrs) > ANYONE


def describe(cidrs: Iterable[str]) -> str:
    count = internet_addresses(cidrs)
    return f"{count:,} internet addresses ({count / INTERNET_ADDRESSES:.1%} of the IPv4 internet)"
