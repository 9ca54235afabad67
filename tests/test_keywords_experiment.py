"""Issue 12, study 5: the WordNet concept sets (experiments/wordnet.py) and the keyword
experiment's constraint and scores (experiments/keywords.py).

References: the committed WordNet excerpt must reproduce the committed sample (built
from the full WordNet 3.0 files); whole-word regex matches for "the concepts occur in
the sentence"; hand-listed English inflections; Python ``in`` for the keyword
language; sacrebleu's ``corpus_bleu`` and a hand-computed BLEU for the scores.
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import numpy as np
import pytest

from experiments import keywords as kw
from experiments import wordnet as wn

DATA = Path(__file__).parent / "data" / "wordnet"
SAMPLE = DATA / "sample.jsonl"
DICT = DATA / "dict"


@pytest.fixture(scope="module")
def rows():
    return wn.read_jsonl(SAMPLE)


@pytest.fixture(scope="module")
def lex():
    return wn.load_lexicon(DICT)


# --------------------------------------------------------------------------- data
def test_excerpt_reproduces_sample(rows):
    """Parsing the committed WordNet excerpt gives exactly the committed sample rows
    (which were built from the full WordNet 3.0 files)."""
    built = {r["id"]: r for r in wn.build(DICT, seed=0)}
    assert len(rows) == 40
    for r in rows:
        assert built.get(r["id"]) == r, r["id"]


def test_build_is_seeded(rows):
    a = {r["id"]: r["concepts"] for r in wn.build(DICT, seed=0)}
    b = {r["id"]: r["concepts"] for r in wn.build(DICT, seed=1)}
    assert a == {r["id"]: r["concepts"] for r in wn.build(DICT, seed=0)}
    assert a.keys() == b.keys() and a != b


def test_concepts_occur_in_their_sentence(rows, lex):
    for r in rows:
        ex_words = re.findall(r"[A-Za-z]+", r["example"])
        ref_words = re.findall(r"[A-Za-z]+", r["reference"])
        assert 3 <= len(r["concepts"]) <= 5
        assert r["concepts"] == sorted(r["concepts"]) and len(set(r["concepts"])) == len(r["concepts"])
        assert wn.MIN_WORDS <= len(r["example"].split()) <= wn.MAX_WORDS
        for lemma, forms, word in zip(r["concepts"], r["forms"], r["words"]):
            assert word in ex_words                            # really in the sentence
            assert any(f in ref_words for f in forms)          # and in the reference
            assert word in forms and lemma in forms
            assert wn.lemmatize(word, lex)[0] == lemma         # and lemmatises to the concept
            assert lemma not in wn.STOPWORDS


def test_reference_is_the_example_as_a_sentence(rows):
    for r in rows:
        ref, ex = r["reference"], r["example"]
        assert ref[0].isupper() and ref[-1] in ".!?"
        assert ref.rstrip(".") == (ex[0].upper() + ex[1:]).rstrip(".")


def test_parse_data_line(tmp_path):
    line = ('00022686 29 v 06 stimulate 0 arouse 0 brace 0 energize 0 energise 0 perk_up 1 '
            '000 | cause to be alert and energetic; "Coffee and tea stimulate me"; '
            '"This herbal infusion doesn\'t stimulate"  ')
    p = tmp_path / "data.verb"
    p.write_text("  1 This software and database is provided ...\n" + line + "\n")
    assert list(wn.parse_examples(p, "v")) == [
        ("00022686", 0, "Coffee and tea stimulate me"),
        ("00022686", 1, "This herbal infusion doesn't stimulate")]


def test_index_tag_counts(lex):
    # index.noun: "dog n 7 5 @ ~ #m #p %p 7 1 ..." -> tagsense_cnt 1
    line = next(l for l in (DICT / "index.noun").read_text().splitlines() if l.startswith("dog "))
    f = line.split()
    assert lex.lemmas["n"]["dog"] == int(f[5 + int(f[3])]) > 0


@pytest.mark.parametrize("lemma,pos,expected,absent", [
    ("run", ["v"], {"run", "runs", "ran", "running"}, {"runed", "runing"}),
    ("mouse", ["n"], {"mouse", "mice"}, {"mouses"}),
    ("child", ["n"], {"child", "children"}, {"childs"}),
    ("box", ["n", "v"], {"box", "boxes", "boxed", "boxing"}, set()),
    ("city", ["n"], {"city", "cities"}, {"citys"}),
    ("day", ["n"], {"day", "days"}, {"daies"}),
    ("make", ["v"], {"make", "makes", "made", "making"}, {"maked", "makeing"}),
    ("see", ["v"], {"see", "sees", "saw", "seen", "seeing"}, {"seed"}),
    ("agree", ["v"], {"agree", "agrees", "agreed", "agreeing"}, {"agreing"}),
    ("stop", ["n", "v"], {"stop", "stops", "stopped", "stopping"}, {"stoped"}),
    ("lie", ["v"], {"lie", "lies", "lying", "lay", "lain"}, {"lieing"}),
    ("speak", ["v"], {"speak", "speaks", "spoke", "spoken", "speaking"}, {"speaked"}),
])
def test_inflections(lex, lemma, pos, expected, absent):
    forms = set(wn.inflections(lemma, pos, lex))
    assert expected <= forms and not (absent & forms)
    assert wn.inflections(lemma, pos, lex)[0] == lemma


@pytest.mark.parametrize("word,lemma", [("ran", "run"), ("mice", "mouse"), ("children", "child"),
                                        ("stopped", "stop"), ("lying", "lie"), ("dogs", "dog"),
                                        ("cities", "city"), ("boxes", "box"), ("spoke", "speak")])
def test_lemmatize(lex, word, lemma):
    assert wn.lemmatize(word, lex)[0] == lemma


def test_stopwords_are_not_concepts(lex):
    for w in ("is", "has", "does", "was", "the", "be", "have"):
        assert wn.lemmatize(w, lex) is None


# --------------------------------------------------------------------------- constraint
@pytest.fixture(scope="module")
def byte_vocab():
    from jaxcd import Vocabulary
    return Vocabulary.from_token_bytes([bytes([i]) for i in range(256)] + [b""], eos_id=256,
                                       name="bytes")


def _accepts(fa, token_ids) -> bool:
    s = fa.initial_state
    for t in list(token_ids) + [fa.eos_id]:
        s = fa.next_state(s, int(t))
        if s == fa.dead_state:
            return False
    return s == fa.final_state


def _drop_concept(text: str, forms) -> str:
    for f in sorted(forms, key=len, reverse=True):
        text = text.replace(f, "X")
    return text


def test_prune_forms_keeps_the_language():
    forms = ["take", "takes", "took", "Take", "taking", "Taking", "Took"]
    kept = kw.prune_forms(forms)
    assert set(kept) == {"take", "took", "Take", "taking", "Taking", "Took"}
    rng = random.Random(0)
    alphabet = "takesinogTKx "
    for _ in range(2000):
        s = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 10)))
        assert any(f in s for f in forms) == any(f in s for f in kept)


def test_constraint_accepts_reference_rejects_missing_concept(rows, byte_vocab):
    """On a byte vocabulary (token = byte): the automaton accepts every reference, and
    rejects it once any one concept's forms are removed; Python's ``in`` agrees."""
    import jaxcd
    for r in rows[:12]:
        fa = jaxcd.compile_keywords(kw.constraint_groups(r), byte_vocab, text_pattern=kw.TEXT_PATTERN)
        ref = r["reference"]
        assert kw.satisfies(ref, r) and _accepts(fa, ref.encode())
        for forms in r["forms"]:
            bad = _drop_concept(ref, forms)
            assert not kw.satisfies(bad, r)
            assert not _accepts(fa, bad.encode()), (r["id"], bad)
        assert not _accepts(fa, (ref + "\n").encode())     # one line of printable ASCII
        assert fa.min_budget <= len(ref.encode()) + 1


def test_constraint_on_the_real_vocabulary(rows, smol_tokenizer, smol_vocab):
    import jaxcd
    r = next(r for r in rows if len(r["concepts"]) == 3)
    fa = jaxcd.compile_keywords(kw.constraint_groups(r), smol_vocab, text_pattern=kw.TEXT_PATTERN)
    ids = smol_tokenizer.encode(r["reference"], add_special_tokens=False)
    assert _accepts(fa, ids)
    jaxcd.walk_prefix(fa, ids, budget=len(ids) + 1)         # completes within len + 1 tokens
    bad = smol_tokenizer.encode(_drop_concept(r["reference"], r["forms"][0]), add_special_tokens=False)
    assert not _accepts(fa, bad)


# --------------------------------------------------------------------------- scores
def test_coverage_whole_words():
    r = {"forms": [["dog", "dogs", "Dog"], ["ball", "balls"], ["catch", "caught"]]}
    assert kw.coverage("The dog caught two balls.", r) == 1.0
    assert kw.coverage("A dogma about footballs.", r) == 0.0       # substrings do not count
    assert kw.coverage("DOGS catch things", r) == pytest.approx(2 / 3)


def test_bleu_hand_computed():
    # hyp "a b c d e" vs ref "a b c d f": precisions 4/5, 3/4, 2/3, 1/2, BP 1
    expected = 100 * (4 / 5 * 3 / 4 * 2 / 3 * 1 / 2) ** 0.25
    assert kw.corpus_bleu(["a b c d e"], ["a b c d f"]) == pytest.approx(expected, abs=0.01)
    assert kw.corpus_bleu(["the cat sat ."], ["the cat sat ."]) == pytest.approx(100)


def test_bootstrap_bleu_matches_sacrebleu(rows):
    import sacrebleu
    refs = [r["reference"] for r in rows]
    rng = random.Random(0)
    hyps = [" ".join(rng.sample(r["reference"].split(), len(r["reference"].split()))) for r in rows]
    stats = kw.bleu_stats(hyps, refs)
    assert kw.bleu_from_stats(stats) == pytest.approx(sacrebleu.corpus_bleu(hyps, [refs]).score)
    idx = np.random.default_rng(1).integers(0, len(rows), size=len(rows))
    assert kw.bleu_from_stats(stats[idx]) == pytest.approx(
        sacrebleu.corpus_bleu([hyps[i] for i in idx], [[refs[i] for i in idx]]).score)
    lo, hi = kw.bootstrap_ci(stats, stat=kw.bleu_from_stats, n=200)
    assert lo <= kw.bleu_from_stats(stats) <= hi


def test_summary_and_markdown(rows):
    by_id = {r["id"]: r for r in rows}
    preds = []
    for i, r in enumerate(rows[:10]):
        out = r["reference"] if i % 2 == 0 else "Nothing here."
        preds.append({"id": r["id"], "method": "gcd", "particles": 4, "output": out,
                      "valid": kw.satisfies(out, r), "coverage": kw.coverage(out, r),
                      "seconds": 1.0})
    (s,) = kw.summarize(preds, by_id)
    assert s["n"] == 10 and s["valid_pct"] == 50.0 and s["coverage_pct"] == 50.0
    refs = [by_id[p["id"]]["reference"] for p in preds]
    import sacrebleu
    assert s["bleu"] == pytest.approx(sacrebleu.corpus_bleu([p["output"] for p in preds], [refs]).score)
    assert s["valid_ci"][0] <= 50.0 <= s["valid_ci"][1]
    md = kw.markdown([s], {"command": "x", "n_examples": 10})
    assert "| gcd | 4 | 10 | 50.0 [" in md


# --------------------------------------------------------------------------- end to end
def test_entry_point_end_to_end(tmp_path, rows, smol_tokenizer, smol_vocab):
    """The whole study on 2 concept sets with a toy unigram LM over the real vocabulary
    (the real model would take minutes to compile on CPU) and a random 4-state HMM:
    files are written, and every record agrees with the constraint and the scores."""
    import types

    import jax.numpy as jnp
    import sacrebleu
    from hmm_distill import HMMParams
    from jaxcd.generation import Model
    from jaxcd.lm import TableLM

    V = len(smol_vocab)
    rng = np.random.default_rng(0)
    p = rng.random(V) + 0.1
    p[np.asarray(smol_vocab.is_special)] = 0.0
    p[smol_vocab.eos_id] = p.sum() / 20                  # ~5% EOS
    with np.errstate(divide="ignore"):
        logp = np.log(p / p.sum())
    lm = TableLM(logp[None], np.zeros((1, V), np.int32), smol_vocab.eos_id)
    lm.config = types.SimpleNamespace(context_length=None)
    model = Model(lm, lm.params, smol_tokenizer, smol_vocab, "")
    H = 4
    hmm = HMMParams(jnp.asarray(rng.dirichlet(np.ones(H)), jnp.float32),
                    jnp.asarray(rng.dirichlet(np.ones(H), H), jnp.float32),
                    jnp.asarray(rng.dirichlet(np.ones(V), H), jnp.float32))
    out = tmp_path / "kw"
    a = kw.parse_args(["--data", str(SAMPLE), "--methods", "lcd,gcd,smc-lookahead",
                       "--particles", "2", "--hmm", "x.safetensors", "--budget", "auto",
                       "--limit", "2", "--seed", "3", "--out", str(out)])
    res = kw.run(a, model=model, hmm=hmm)
    by_id = {r["id"]: r for r in rows}
    preds = [json.loads(l) for l in (out / "predictions.jsonl").read_text().splitlines()]
    assert len(preds) == 2 * 3
    assert {(p["method"], p["particles"]) for p in preds} == {
        (m, 2) for m in ("lcd", "gcd", "smc-lookahead")}
    for p in preds:
        assert {"id", "method", "particles", "output", "valid", "coverage", "bleu"} <= p.keys()
        r = by_id[p["id"]]
        if p["valid"]:
            assert kw.satisfies(p["output"], r)
        if p["method"] != "lcd":
            assert p["valid"]                               # GCD-based: always satisfied
            assert p["budget"] == kw.auto_budget(p["min_budget"])
        assert p["coverage"] == kw.coverage(p["output"], r)
        assert p["bleu"] == pytest.approx(sacrebleu.sentence_bleu(p["output"], [r["reference"]]).score)
    summary = json.loads((out / "summary.json").read_text())
    assert [(s["method"], s["particles"], s["n"]) for s in summary["summary"]] == [
        ("lcd", 2, 2), ("gcd", 2, 2), ("smc-lookahead", 2, 2)]
    assert summary["summary"] == res["summary"]
    for s in summary["summary"]:
        ps = [p for p in preds if p["method"] == s["method"]]
        assert s["coverage_pct"] == pytest.approx(100 * np.mean([p["coverage"] for p in ps]))
        assert s["bleu"] == pytest.approx(sacrebleu.corpus_bleu(
            [p["output"] for p in ps], [[by_id[p["id"]]["reference"] for p in ps]]).score)
    md = (out / "summary.md").read_text()
    assert md.count("\n| smc-lookahead | 2 | 2 |") == 1 and "BLEU-4" in md
