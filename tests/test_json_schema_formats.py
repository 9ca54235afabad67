"""String formats of draft 2020-12 beyond RFC 3986's (``tests/test_json_schema_uri.py``),
each against an independent reference, the checker jsonschema itself uses for it:

- ``json-pointer``: ``jsonpointer.JsonPointer``; ``relative-json-pointer``: jsonschema's
  own checker (``jsonschema._format``); ``uri-template``: ``uri_template.validate``;
  ``iri`` / ``iri-reference``: ``rfc3987_syntax.is_valid_syntax`` — every string of a
  small alphabet up to a few characters and a seeded sample of longer ones, accepted
  exactly when the reference accepts them (IPv6 literals with an embedded IPv4 address
  left out, as for ``uri``);
- ``regex`` (a regular subset): every accepted string compiles with ``re.compile``
  (warnings are errors), over the same kind of corpus, and common patterns are accepted.
"""

from __future__ import annotations

import itertools
import random
import re
import warnings

import pytest

from jaxcd.automata.fsa import determinize, minimize
from jaxcd.automata.json_schema import schema_to_nfa
from jaxcd.automata.schema_builder import FORMATS, json_string_content_nfa


class _Format:
    """The format's string language twice: as the schema builder builds
    ``{"type": "string", "format": fmt}`` (quotes included) and as the regex read through
    the string's escapes; ``accepts(content)`` checks that both agree."""

    def __init__(self, fmt: str):
        self.whole = minimize(determinize(
            schema_to_nfa({"type": "string", "format": fmt}, "")[0]))
        self.content = minimize(determinize(json_string_content_nfa(FORMATS[fmt],
                                                                    search=False)))

    def accepts(self, content: bytes) -> bool:
        got = self.content.accepts(content)
        assert self.whole.accepts(b'"' + content + b'"') == got, content
        return got


_dfa = _Format


def _sound(d: _Format, texts: list[str], reference) -> int:
    """Every text ``d`` accepts passes ``reference``; returns how many it accepts."""
    accepted = 0
    for s in texts:
        if d.accepts(_json_text(s)):
            assert reference(s), s
            accepted += 1
    return accepted


def _corpus(alphabet: str, short: int, n_long: int, long_len: int, seed: int = 0) -> list[str]:
    out = ["".join(t) for k in range(short + 1) for t in itertools.product(alphabet, repeat=k)]
    rng = random.Random(seed)
    out += ["".join(rng.choice(alphabet) for _ in range(rng.randint(short + 1, long_len)))
            for _ in range(n_long)]
    return out


def _json_text(s: str) -> bytes:
    """The string's content as JSON writes it (jaxcd's escapes), without quotes."""
    import json
    return json.dumps(s, ensure_ascii=False)[1:-1].encode()


def _compare(fmt: str, texts: list[str], reference, skip=lambda s: False) -> int:
    d = _dfa(fmt)
    n_valid = 0
    for s in texts:
        if any(ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F for c in s):
            continue                                    # not writable in jaxcd's strings
        want, got = bool(reference(s)), d.accepts(_json_text(s))
        if got != want and not (want and skip(s)):          # skip: left out, never unsound
            raise AssertionError(f"{fmt}: {s!r}: jaxcd {got}, reference {want}")
        n_valid += want
    return n_valid


def test_json_pointer_against_jsonpointer():
    jsonpointer = pytest.importorskip("jsonpointer")

    def ref(s):
        try:
            jsonpointer.JsonPointer(s)
            return True
        except jsonpointer.JsonPointerException:
            return False

    texts = _corpus("/~01a\"\\ é", 5, 5000, 12) + ["/definitions/a~1b", "/a~2", "a/b", ""]
    assert _compare("json-pointer", texts, ref) > 1000


def test_relative_json_pointer_against_jsonschema():
    pytest.importorskip("jsonpointer")
    from jsonschema._format import is_relative_json_pointer

    def ref(s):
        try:
            return is_relative_json_pointer(s)
        except Exception:  # noqa: BLE001 - jsonpointer's error: not a pointer
            return False

    texts = _corpus("0123#/~a", 4, 5000, 10) + ["0", "1/a", "0#", "01", "10/x~1y", "-1"]
    assert _compare("relative-json-pointer", texts, ref) > 200


_UT_LIT = set("!#$&()*+,-./0123456789:;=?@ABCDEFGHIJKLMNOPQRSTUVWXYZ[]_"
              "abcdefghijklmnopqrstuvwxyz~")
_HEXD = set("0123456789abcdefABCDEF")


def _rfc6570(s: str) -> bool:
    """RFC 6570's grammar, by hand: literals (``ucschar``/``iprivate`` for the non-ASCII
    characters used here, pct-encoded) and expressions with any operator."""
    i = 0
    while i < len(s):
        c = s[i]
        if c == "%":
            if not (i + 2 < len(s) and s[i + 1] in _HEXD and s[i + 2] in _HEXD):
                return False
            i += 3
        elif c == "{":
            j = s.find("}", i)
            if j < 0:
                return False
            body = s[i + 1:j]
            if body[:1] and body[0] in "+#./;?&=,!@|":
                body = body[1:]
            for spec in body.split(","):
                m = re.fullmatch(r"((?:[A-Za-z0-9_]|%[0-9A-Fa-f]{2})"
                                 r"(?:\.?(?:[A-Za-z0-9_]|%[0-9A-Fa-f]{2}))*)(:[1-9][0-9]{0,3}|\*)?",
                                 spec)
                if not m:
                    return False
            i = j + 1
        elif c in _UT_LIT or ord(c) >= 0xA0:
            i += 1
        else:
            return False
    return True


def test_uri_template_against_uri_template():
    """Exactly the templates both RFC 6570 and jsonschema's checker (``uri_template``)
    accept: the package reads any character outside braces as a literal and refuses some
    of the RFC's expressions (a name starting ``%XX``, a prefix over 999, operators
    ``=!@|``), so the automaton takes the templates in both."""
    uri_template = pytest.importorskip("uri_template")
    alphabet = "{}a,.:*+#1%F/=é "
    texts = _corpus(alphabet, 4, 20000, 14) + [
        "http://example.com/{user}/repos{?page,per_page}", "{+path:6}/here", "{#x,y*}",
        "{var:10000}", "{var:0}", "{a.b}", "{a..b}", "{%2Fx}", "{%2}", "}{", "{}", "{;x}",
        "/search{?q}{&lang}", "é{x}", "{x}é"]
    n = _compare("uri-template", texts, lambda s: _rfc6570(s) and uri_template.validate(s),
                 skip=lambda s: "{," in s)       # RFC's reserved "," operator: the package
    assert n > 1000                              # takes it, the automaton does not


@pytest.mark.parametrize("fmt", ["iri", "iri-reference"])
def test_iri_formats_against_rfc3987_syntax(fmt):
    rfc = pytest.importorskip("rfc3987_syntax")
    rule = "iri" if fmt == "iri" else "iri_reference"

    def ref(s):
        return rfc.is_valid_syntax(rule, s)

    alphabet = "a1:/?#[]@%é\ue000 -"
    texts = _corpus(alphabet, 2, 800, 12)
    texts += ["a:" + t for t in _corpus(alphabet, 1, 800, 10, seed=2)]
    texts += [
        "https://例え.jp/パス?q=値#frag", "http://[::1]/ü", "http://[a:b:c:d:e:f:1:2]/ü", "urn:isbn:123", "//h:8/p",
        "mailto:x@y.z", "../ö", "#f", "a:\ue000", "a:?\ue000", "a:#\ue000",
        "http://u:p@h:80/p?q#f", "http://[v1.x:y]/"]
    # IPv6 literals: the full eight-group form only (rfc3987_syntax refuses most "::"
    # forms, e.g. "[::1]", which RFC 3987 allows)
    assert _compare(fmt, texts, ref, skip=lambda s: "[" in s) > 60
    d = _dfa(fmt)
    assert d.accepts(b"http://[1:2:3:4:5:6:7:8]/") and not d.accepts(b"http://[::1]/")


@pytest.mark.parametrize("fmt", ["json-pointer", "relative-json-pointer", "regex",
                                 "uri-template", "iri"])
def test_format_values_inside_an_open_object(fmt):
    """A format's value beside other members of an open object stays a JSON string (a
    '"' inside it is escaped) and the object's automaton stays small."""
    schema = {"type": "object", "properties": {"x": {"type": "string", "format": fmt},
                                               "y": {"type": "integer"}}}
    d = minimize(determinize(schema_to_nfa(schema, "", property_order="schema")[0]))
    assert d.num_states < 3000
    assert not d.accepts(b'{"x":"/"/","y":1}')
    ok = {"json-pointer": '/a\\"b', "relative-json-pointer": '0/a\\"b', "regex": '^a\\"$',
          "uri-template": "{x}", "iri": "a:b"}[fmt]
    assert d.accepts(b'{"x":"' + ok.encode() + b'","y":1,"z":[]}')


def _compiles(s: str) -> bool:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        try:
            re.compile(s)
            return True
        except (re.error, Warning, RecursionError, OverflowError):
            return False


COMMON_REGEXES = [
    "", ".*", "^[a-z0-9-]+$", r"^\d{3}-\d{4}$", "[A-Z][a-z]*", "(foo|bar)", "^(?:[01]\\d|2[0-3]):[0-5]\\d$",
    r"^[\w.+-]+@[\w-]+\.[\w.]+$", r"^https?://", "a{2,5}?", r"\bword\b", r"[^\s]+", "^$",
    "^(([a-z])+.)+[A-Z]([a-z])+$", r"^\/api\/v[0-9]+", "x{10,99}", "ab|cd|", r"[\[\]]",
    "[a-zA-Z_][a-zA-Z0-9_]*",
]


def test_regex_format_accepts_only_compiling_regexes():
    d = _dfa("regex")
    alphabet = "a\\()[]{}|*+?^$.-,0129:!=dbB"
    assert _sound(d, _corpus(alphabet, 3, 30000, 16, seed=1), _compiles) > 8000
    for s in COMMON_REGEXES:
        assert _compiles(s), s
        assert d.accepts(_json_text(s)), s
    # outside the subset (refused, although re compiles them): back-references, named
    # groups, look-arounds, flags, a quantified anchor's neighbours
    for s in [r"(a)\1", "(?P<n>a)", "(?=a)", "(?i)a", "[z-a]", "a**", "a{3,2}", "(", "a)",
              "[a", "*", "{", "]"]:
        assert not d.accepts(_json_text(s)), s


def test_idn_hostname_only_what_idna_encodes():
    """``idn-hostname``: a subset (ASCII labels, at most 4 of at most 62 characters) of
    what jsonschema's checker, ``idna.encode``, takes: every accepted name encodes."""
    idna = pytest.importorskip("idna")

    def ref(s):
        try:
            idna.encode(s)
            return True
        except (idna.IDNAError, UnicodeError, ValueError):
            return False

    d = _dfa("idn-hostname")
    texts = _corpus("a1-.Z", 6, 20000, 24) + [
        "example.com", "xn--nxasmq6b", "ab--cd", "a" * 62, "a" * 63, ".".join(["b" * 62] * 4),
        "münchen.de", "-a", "a-", "a..b"]
    assert _sound(d, texts, ref) > 3000
    for s in ["example.com", "a-b.c1", "A.b", "abc-d", "a" * 62]:
        assert d.accepts(_json_text(s)), s
    for s in ["ab--cd", "xn--nxasmq6b", "-a", "a..b", "a" * 63]:
        assert not d.accepts(_json_text(s)), s


_ATEXT = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789!#$%&'*+/=?^_`{|}~-")


def _rfc6531_dot_atom_ascii_domain(s: str) -> bool:
    """RFC 6531's ``Dot-string`` local part (``atext`` or any non-ASCII character), "@",
    an ASCII domain of LDH labels with an alphabetic top label of 2-63 letters."""
    if s.count("@") != 1:
        return False
    local, domain = s.split("@")
    atoms = local.split(".")
    if not all(a and all(c in _ATEXT or ord(c) >= 0xA0 for c in a) for a in atoms):
        return False
    labels = domain.split(".")
    if len(labels) < 2 or not re.fullmatch(r"[A-Za-z]{2,63}", labels[-1]):
        return False
    return all(re.fullmatch(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?", x)
               for x in labels[:-1])


def test_idn_email_is_rfc6531_dot_atoms():
    """``idn-email``: exactly RFC 6531 dot-atom local parts (non-ASCII allowed) at an
    ASCII domain, by hand above; each also passes jsonschema's checker ("@" in it)."""
    from jsonschema._format import is_email
    texts = _corpus("aé.@-c", 5, 20000, 14) + [
        "用户@例子.广告", "ü.ö@example.org", "a@b.co", "a..b@x.com", ".a@x.com", "a@x.c",
        "a b@x.com", "x@ex--ample.com", "θ@x.io"]
    texts += [lo + "@" + dom for lo in _corpus("aé.-", 3, 0, 0)
              for dom in ["ex.com", "a-b.io", "x.c", "e..com", "-e.com", "e1.e2.org"]]
    n = _compare("idn-email", texts, _rfc6531_dot_atom_ascii_domain)
    assert n > 100
    _sound(_dfa("idn-email"), texts, is_email)


# strings of each format that jsonschema's checker takes (the reference: the checkers of
# tests/test_json_schema.py's FORMAT_CHECKER) and the format's own regex may not
_CHECKER_TAKES = {
    "email": ["x b@c", "@", "a@b", "é@😀", '"q"@x'],
    "idn-email": ["x b@c", "@", "é@😀"],
    "uuid": ["12345678-1234-1234-1234-1234-5678-9abc", "12345678-1234-1234-1234-123456789ABC"],
    "time": ["00:00:00+01:60", "23:59:59Z", "12:00:00.5-23:59"],
    "date-time": ["2024-01-01T00:00:00+01:60", "2024-02-29T23:59:59.1Z"],
    "date": ["2024-02-29", "0001-01-01", "9999-12-31"],
    "ipv4": ["1.2.3.4", "255.0.0.255"],
    "ipv6": ["::ffff:1.2.3.4", "fe80::1%eth0", "::", "1::"],
    "uri": ["x:", "a:b", "http://a/b?c#d", "urn:isbn:123"],
    "iri": ["x:é", "http://é/"],
    "hostname": ["a", "a-b.c", "x" * 63],
    "regex": ["(?i)a", "a{2}", "[a-z]+", "\\d"],
    "duration": ["P1D", "PT1H", "P1W"],
    "json-pointer": ["", "/a~0b", "/~1"],
}


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_negated_format_refuses_what_the_checker_takes(fmt):
    """Under ``not`` (and every subtracted operand: oneOf's other branches, the count of
    ``contains``) a format stands for a superset of its checker's strings
    (``NEG_FORMATS``), so no string the checker calls of that format is ever accepted
    there, even where the format's own regex is stricter (email's checker only wants an
    "@"). Checked on the strings above and a seeded sample of short strings over their
    characters, against the checker."""
    from test_json_schema import FORMAT_CHECKER
    import json as _json

    neg = minimize(determinize(schema_to_nfa({"not": {"type": "string", "format": fmt}},
                                             "")[0]))
    count = minimize(determinize(schema_to_nfa(
        {"type": "array", "contains": {"type": "string", "format": fmt}, "maxContains": 1,
         "items": {"type": "string"}}, "")[0]))
    texts = list(_CHECKER_TAKES.get(fmt, []))
    alphabet = sorted(set("".join(texts)) | set("aZ09:-.@/ "))
    rng = random.Random(fmt)
    texts += ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 10)))
              for _ in range(3000)]
    taken = 0
    for s in texts:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ok = FORMAT_CHECKER.conforms(s, fmt)
        if not ok:
            continue
        taken += 1
        t = _json.dumps(s, ensure_ascii=False, separators=(",", ":"))
        assert not neg.accepts(t.encode()), (fmt, s)
        # two strings of the format in an array with maxContains 1: never accepted
        assert not count.accepts(f"[{t},{t}]".encode()), (fmt, s)
    assert taken > 0
