"""Which network addresses an image fetch may reach (the SSRF guard).

A gallery's URIs come from payloads that users or upstream systems wrote, so by
default a fetch may not reach this machine, the private network around it or a
cloud metadata service. The check runs on the addresses a host name resolves to,
at the moment of connecting (so on every redirect, and a name that resolves
differently a second time gains nothing: the connection goes to the address checked).
"""

from __future__ import annotations

import ipaddress
import socket

from rm_qdrant.errors import AddressRefused, Unresolvable

#: Host names of cloud metadata services, refused whatever they resolve to.
METADATA_HOSTS = frozenset({"metadata.google.internal", "metadata", "instance-data", "metadata.azure.com"})


def check_address(address: str) -> None:
    """Refuse an address that is not globally routable (loopback, private, link-local, ...).

    >>> check_address("93.184.216.34")  # public: returns
    >>> try:
    ...     check_address("169.254.169.254")
    ... except AddressRefused as exc:
    ...     print(exc)
    169.254.169.254 is a link-local address
    """
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    for kind in ("loopback", "unspecified", "link_local", "private", "multicast", "reserved"):
        if getattr(ip, f"is_{kind}"):
            raise AddressRefused(f"{address} is a {kind.replace('_', '-')} address")
    if not ip.is_global:
        raise AddressRefused(f"{address} is not a public address")


def resolve_public(host: str, port: int) -> str:
    """The address to connect to for ``host``: every address it resolves to must be public.

    Raises:
        AddressRefused: the host is a metadata service, or resolves to a non-public address.
        Unresolvable: the name does not resolve.
    """
    name = host.strip("[]").rstrip(".").lower()
    if name in METADATA_HOSTS:
        raise AddressRefused(f"{name} is a cloud metadata service")
    try:
        found = socket.getaddrinfo(name, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:
        raise Unresolvable(f"cannot resolve {name}: {exc}") from exc
    addresses = [str(info[4][0]) for info in found]
    for address in addresses:
        check_address(address)
    return addresses[0]
