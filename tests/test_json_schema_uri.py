"""``format: uri`` and ``uri-reference`` are RFC 3986 exactly (what jsonschema's format
checkers validate when rfc3987 or rfc3986-validator is installed). The reference here
is independent of the builder's regex: RFC 3986 appendix B's splitter, then each
component checked by hand (``ipaddress`` for IPv6 literals). Every string of a small
alphabet up to 4 characters, and a seeded sample of longer ones: no invalid string
accepted; every valid one accepted (except IPv6 literals with an embedded IPv4 address
or a zone, which the automaton leaves out)."""

from __future__ import annotations

import ipaddress
import itertools
import random
import re

import pytest

from jaxcd.automata.fsa import determinize, minimize
from jaxcd.automata.schema_builder import FORMATS, json_string_content_nfa

UNRES_SUB = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-._~!$&'()*+,;=")
HEX = set("0123456789abcdefABCDEF")


def _chars_ok(s: str, extra: str) -> bool:
    i = 0
    while i < len(s):
        c = s[i]
        if c == "%":
            if len(s) < i + 3 or s[i + 1] not in HEX or s[i + 2] not in HEX:
                return False
            i += 3
            continue
        if c not in UNRES_SUB and c not in extra:
            return False
        i += 1
    return True


def _host_ok(host: str) -> bool:
    if host.startswith("["):
        if not host.endswith("]"):
            return False
        inner = host[1:-1]
        if inner[:1] in ("v", "V"):
            m = re.fullmatch(r"[vV]([0-9A-Fa-f]+)\.(.+)", inner)
            return bool(m) and all(c in UNRES_SUB or c == ":" for c in m.group(2))
        try:
            ipaddress.IPv6Address(inner)
        except ValueError:
            return False
        return "%" not in inner
    return _chars_ok(host, "")


def rfc3986(s: str, reference: bool) -> bool:
    m = re.fullmatch(r"(?:([^:/?#]+):)?(?://([^/?#]*))?([^?#]*)(?:\?([^#]*))?(?:#(.*))?", s,
                     re.S)
    scheme, authority, path, query, fragment = m.groups()
    if scheme is not None:
        if not re.fullmatch(r"[A-Za-z][A-Za-z0-9+.\-]*", scheme):
            return False
    elif not reference:
        return False
    if authority is not None:
        if authority.count("@") > 1:
            return False
        userinfo, _, hostport = authority.rpartition("@")
        if "@" in authority and not _chars_ok(userinfo, ":"):
            return False
        if hostport.startswith("["):
            host, _, port = hostport.partition("]")
            host += "]"
            if port and not port.startswith(":"):
                return False
            port = port[1:]
        else:
            host, _, port = hostport.partition(":")
        if not _host_ok(host) or not port.isdigit() and port != "":
            return False
        if path and not path.startswith("/"):
            return False
    elif path.startswith("//"):
        return False
    if not all(_chars_ok(seg, ":@") for seg in path.split("/")):
        return False
    if scheme is None and authority is None and not path.startswith("/"):
        if ":" in path.split("/")[0]:
            return False
    for part in (query, fragment):
        if part is not None and not _chars_ok(part, ":@/?"):
            return False
    return True


ALPHABET = "a1:/?#[]@%0.v -"


@pytest.mark.parametrize("fmt", ["uri", "uri-reference"])
def test_uri_formats_against_rfc3986(fmt):
    d = minimize(determinize(json_string_content_nfa(FORMATS[fmt], search=False)))
    ref = fmt == "uri-reference"
    texts = ["".join(t) for k in range(5) for t in itertools.product(ALPHABET, repeat=k)]
    rng = random.Random(0)
    texts += ["".join(rng.choice(ALPHABET + "Ff:::") for _ in range(rng.randint(5, 14)))
              for _ in range(20000)]
    texts += ["https://x.org/a?b=c#d", "urn:isbn:123", "http://[::1]/", "http://[v1.x:y]/",
              "//h:8/p", "a:b", "mailto:x@y.z", "http://u:p@h:80/p?q#f", "../x", "#f"]
    n_valid = 0
    for s in texts:
        want = rfc3986(s, ref)
        got = d.accepts(s.encode())
        if got:
            assert want, s                                  # sound
        elif want:
            assert "[" in s and "." in s, s                 # complete, but IPv4-in-IPv6
        n_valid += want
    assert n_valid > 100
    assert not d.accepts(b"://")                            # MaskBench: bounded-context
