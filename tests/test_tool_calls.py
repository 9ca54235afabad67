"""Function calling on BFCL data (experiments.bfcl, experiments.runner,
experiments.tool_calls) and jaxcd.automata.tensorized.pad_automaton.

References: BFCL's own AST checker and AST decoding functions (from the ``bfcl-eval``
wheel), ``jsonschema`` and ``json``/``ast`` for the output formats, the unpadded
automaton for the padded one. Data: ``tests/data/bfcl/`` — a seeded sample of
bfcl-eval 2026.3.23 (3 examples from each of simple_python, multiple, parallel,
parallel_multiple, live_multiple whose ground truth validates against the converted
parameter schemas, 1 from every other single-turn category).
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import jax
import jsonschema
import numpy as np
import pytest

from experiments import bfcl
from experiments.runner import Shapes, bootstrap_ci, build_constraint, dfa_predicate
from jaxcd.automata.fsa import determinize, minimize

DATA = Path(__file__).parent / "data" / "bfcl"
QUESTIONS = DATA / "questions.jsonl"
ANSWERS = DATA / "possible_answer.jsonl"


@pytest.fixture(scope="module")
def examples():
    return bfcl.load_examples(QUESTIONS, ANSWERS)


@pytest.fixture(scope="module")
def main_examples(examples):
    return [e for e in examples if e.category in bfcl.MAIN_CATEGORIES]


@pytest.fixture(scope="module")
def dfas(main_examples):
    return {(e.id, f): minimize(determinize(bfcl.constraint_nfa(e, f)[0]))
            for e in main_examples for f in ("json", "python")}


def test_sample_covers_categories(examples):
    cats = {e.category for e in examples}
    assert set(bfcl.SINGLE_TURN) <= cats
    for e in examples:
        assert (e.answer is None) == (e.category in ("irrelevance", "live_irrelevance",
                                                     "live_relevance"))


# ---------------------------------------------------------------------------------------
# pseudo-types -> JSON Schema on real examples
# ---------------------------------------------------------------------------------------
def test_pseudo_types_converted(examples):
    """Every BFCL pseudo-type in the sample becomes JSON Schema that the reference
    validator accepts as a schema, and the ground truth's first options validate."""
    seen = set()

    def walk(s):
        if isinstance(s, dict):
            if isinstance(s.get("type"), str):
                seen.add(s["type"])
            for v in s.values():
                walk(v)
        elif isinstance(s, list):
            for v in s:
                walk(v)

    for e in examples:
        for f in e.functions:
            walk(f["parameters"])
            schema = bfcl.function_to_schema(f)
            jsonschema.Draft202012Validator.check_schema(schema)
            assert schema["type"] == "object"
    assert {"dict", "float"} <= seen                 # the sample has real pseudo-types
    for e in examples:
        if e.category in bfcl.MAIN_CATEGORIES:
            for name, args in bfcl.answer_calls(e):
                f = next(f for f in e.functions if f["name"] == name)
                jsonschema.validate(args, bfcl.function_to_schema(f))


def test_pseudo_type_examples():
    f = {"name": "f", "parameters": {"type": "dict", "properties": {
        "x": {"type": "float"}, "t": {"type": "tuple", "items": {"type": "integer"}},
        "d": {"type": "dict", "properties": {"k": {"type": "string"}}},
        "a": {"type": "any"}}, "required": ["x"]}}
    s = bfcl.function_to_schema(f)
    assert s["type"] == "object" and s["properties"]["x"]["type"] == "number"
    assert s["properties"]["t"]["type"] == "array" and s["properties"]["d"]["type"] == "object"
    # the experiments' `any` is BFCL's (its checker wants a str); the library's default
    # is any JSON value
    assert s["properties"]["a"]["type"] == "string"
    jsonschema.validate({"x": 1.5, "t": [1, 2], "d": {"k": "v"}, "a": "[None]"}, s)
    for bad in ({"x": "1.5"}, {"x": 1.5, "a": [None]}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, s)
    from jaxcd.automata.bfcl import function_to_schema
    g = function_to_schema(f)
    assert "type" not in g["properties"]["a"]
    jsonschema.validate({"x": 1.5, "a": [None]}, g)
    assert function_to_schema(f, any_as_string=True) == s


# ---------------------------------------------------------------------------------------
# constraints: accept the ground truth, reject near misses
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", ["json", "python"])
def test_constraint_accepts_ground_truth(main_examples, dfas, fmt):
    for e in main_examples:
        text = bfcl.render(bfcl.answer_calls(e), fmt)
        assert dfas[e.id, fmt].accepts(text.encode()), (e.id, text)
        # the rendering is what the format says: json.loads / ast.literal_eval-able
        if fmt == "json":
            data = json.loads(text)
            assert [c["name"] for c in data] == [n for n, _ in bfcl.answer_calls(e)]
        else:
            tree = ast.parse(text, mode="eval").body
            assert isinstance(tree, ast.List) and all(isinstance(c, ast.Call) for c in tree.elts)


def _near_misses(e, fmt):
    calls = bfcl.answer_calls(e)
    name, args = calls[0]
    f = next(f for f in e.functions if f["name"] == name)
    schema = bfcl.function_to_schema(f)
    out = [bfcl.render([(name + "x", args)] + calls[1:], fmt),           # unknown function
           bfcl.render(calls, fmt)[:-1],                                 # cut short
           bfcl.render(calls, fmt) + " ",                                # trailing text
           bfcl.render(calls, fmt).replace("[", "", 1)]                  # not a list
    req = [k for k in schema.get("required", []) if k in args]
    if req:
        out.append(bfcl.render([(name, {k: v for k, v in args.items() if k != req[0]})]
                               + calls[1:], fmt))                        # missing required
    for k, v in args.items():
        t = schema["properties"][k].get("type")
        if t in ("integer", "number") and not isinstance(v, bool):
            out.append(bfcl.render([(name, {**args, k: str(v)})] + calls[1:], fmt))  # type
            break
    out.append(bfcl.render([(name, {**args, "not_a_param": 1})] + calls[1:], fmt))
    return out


@pytest.mark.parametrize("fmt", ["json", "python"])
def test_constraint_rejects_near_misses(main_examples, dfas, fmt):
    n = 0
    for e in main_examples:
        for text in _near_misses(e, fmt):
            assert not dfas[e.id, fmt].accepts(text.encode()), (e.id, text)
            n += 1
    assert n >= 5 * len(main_examples)


def test_python_format_details():
    ex = bfcl.Example("simple_python_0", "simple_python", [], [{
        "name": "m.f", "parameters": {"type": "dict", "properties": {
            "s": {"type": "string"}, "n": {"type": "integer"},
            "d": {"type": "dict", "properties": {"a": {"type": "float"},
                                                 "b": {"type": "string", "enum": ["x", "y"]}},
                  "required": ["a"]},
            "l": {"type": "array", "items": {"type": "integer"}}}, "required": ["s"]}}], None)
    dfa = minimize(determinize(bfcl.python_nfa(ex)))
    good = ["[m.f(s='a')]", "[m.f(s='it\\'s', n=-3)]", "[m.f(s='', d={'a': 1.5})]",
            "[m.f(s='q', d={'a': 2, 'b': 'y'}, l=[1, 2, 3])]", "[m.f(s='a'), m.f(s='b', l=[])]"]
    bad = ["[]", "[m.f()]", "[m.f(n=1, s='a')]", "[m.f(s=\"a\")]", "[m.f(s='a', d={})]",
           "[m.f(s='a', d={'b': 'x'})]", "[m.f(s='a', d={'a': 1, 'b': 'z'})]",
           "[m.f(s='a', l=[1.5])]", "[m.f(s='a'),m.f(s='b')]", "m.f(s='a')"]
    for t in good:
        assert dfa.accepts(t.encode()), t
        ast.parse(t, mode="eval")
    for t in bad:
        assert not dfa.accepts(t.encode()), t
    irr = bfcl.Example("irrelevance_0", "irrelevance", [], ex.functions, None)
    assert minimize(determinize(bfcl.python_nfa(irr))).accepts(b"[]")
    assert minimize(determinize(bfcl.constraint_nfa(irr, "json")[0])).accepts(b"[]")


# ---------------------------------------------------------------------------------------
# scoring: BFCL's checker, and our decoding of outputs against BFCL's own
# ---------------------------------------------------------------------------------------
def _bfcl_resolver():
    """BFCL's ``resolve_ast_call`` / ``resolve_ast_by_type``, taken from the wheel's
    ``model_handler/utils.py`` source (that module needs API clients to import)."""
    src = (bfcl.data_root() / "bfcl_eval" / "model_handler" / "utils.py").read_text()
    mod = ast.parse(src)
    keep = [n for n in mod.body if isinstance(n, ast.FunctionDef)
            and n.name in ("resolve_ast_call", "resolve_ast_by_type")]
    assert len(keep) == 2
    ns = {"ast": ast}
    exec(compile(ast.Module(body=keep, type_ignores=[]), "bfcl_utils", "exec"), ns)
    return ns["resolve_ast_call"]


def test_parse_matches_bfcl_decoder(main_examples):
    resolve = _bfcl_resolver()
    for e in main_examples:
        calls = bfcl.answer_calls(e)
        text = bfcl.render(calls, "python")
        ref = [resolve(c) for c in ast.parse(text, mode="eval").body.elts]
        assert bfcl.parse_output(text, "python") == ref
        assert bfcl.parse_output(bfcl.render(calls, "json"), "json") == ref


def test_checker_scores_ground_truth_and_near_misses(examples, main_examples):
    checker, Language = bfcl.load_checker()
    assert checker.__module__ == "bfcl_eval.eval_checker.ast_eval.ast_checker"
    for e in main_examples:
        calls = bfcl.answer_calls(e)
        for fmt in ("json", "python"):
            text = bfcl.render(calls, fmt)
            ok, why = bfcl.score(e, text, fmt)
            assert ok is True, (e.id, fmt, why)
            # the checker called directly on the same decoded output agrees
            res = checker(e.functions, bfcl.parse_output(text, fmt), e.answer, Language.PYTHON,
                          e.category, bfcl.MODEL_NAME)
            assert res["valid"] is True
        # a wrong value of some listed argument is wrong; an unparsable output is wrong
        name, args = calls[0]
        k = next(iter(args))
        v = args[k]
        wrong = (not v) if isinstance(v, bool) else (v + 1000 if isinstance(v, (int, float))
                                                     else "zz" + json.dumps(v))
        bad = [(name, {**args, k: wrong})] + calls[1:]
        for fmt in ("json", "python"):
            assert bfcl.score(e, bfcl.render(bad, fmt), fmt)[0] is False, (e.id, k)
            assert bfcl.score(e, bfcl.render(calls, fmt)[:-1], fmt)[0] is False
    # the categories without a ground truth score as defined
    irr = next(e for e in examples if e.category == "irrelevance")
    assert bfcl.score(irr, "[]", "python")[0] is True
    assert bfcl.score(irr, "[f(a=1)]", "python")[0] is False
    rel = next(e for e in examples if e.category == "live_relevance")
    assert bfcl.score(rel, "[]", "json")[0] is None
    # Java / JavaScript categories run through the checker without crashing
    for e in examples:
        if e.category in ("simple_java", "simple_javascript"):
            ok, why = bfcl.score(e, bfcl.render(bfcl.answer_calls(e), "json"), "json")
            assert ok in (True, False)


def test_prompt_uses_chat_template_with_tools(examples):
    from jaxcd.generation import format_prompt
    from jaxcd.tokenizer import load_tokenizer
    tok = load_tokenizer()
    e = examples[0]
    ids = bfcl.prompt_ids(e, tok, "python")
    text = tok.decode(ids)
    assert e.functions[0]["name"] in text and "Python list" in text
    assert e.question[-1]["content"] in text
    user = "\n".join(m["content"] for m in e.question if m["role"] != "system")
    assert ids == format_prompt(tok, user, system=bfcl.SYSTEM["python"], tools=bfcl.tool_docs(e))


# ---------------------------------------------------------------------------------------
# padding (jaxcd.automata.tensorized.pad_automaton) and the AWRS oracle
# ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def vocab():
    from jaxcd.tokenizer import load_tokenizer
    from jaxcd.vocab import Vocabulary
    return Vocabulary.from_tokenizer(load_tokenizer())


def test_pad_automaton_same_language_and_one_compile(main_examples, vocab):
    from jaxcd.decoding import gcd
    from jaxcd.automata.lifting import tensorize
    from jaxcd.automata.tensorized import pad_automaton
    shapes = Shapes(min_states=1024, min_edges=4096, min_degree=64, min_mask_rows=512)
    rng = np.random.default_rng(0)
    e0 = main_examples[0]
    dfa = minimize(determinize(bfcl.constraint_nfa(e0, "json")[0]))
    fa = tensorize(dfa, vocab)
    p, new_id = pad_automaton(fa, 1024, 4096, 64)
    assert (p.num_states, p.num_edges, p.out_dst.shape[1]) == (1024, 4096, 64)
    assert p.min_budget == fa.min_budget
    for s in range(fa.num_states):
        for left in (None, 1, 3, 10, 40):
            assert np.array_equal(p.mask_words(new_id[s], left), fa.mask_words(s, left))
        for t in rng.integers(0, fa.vocab_size, 40).tolist() + [fa.eos_id]:
            assert new_id[fa.next_state(s, t)] == p.next_state(new_id[s], t)
    budget = fa.min_budget + 8
    b0 = np.asarray(gcd.backward(fa.to_device(), budget).beta)
    b1 = np.asarray(gcd.backward(p.to_device(), budget).beta)
    assert np.array_equal(b1[:, new_id], b0)
    assert not b1[:, np.setdiff1d(np.arange(1024), new_id)].any()
    # several examples' automata padded to one shape: gcd.backward compiles once
    n0 = gcd._backward._cache_size()
    for e in main_examples[:4]:
        c = build_constraint(bfcl.constraint_nfa(e, "python")[0], vocab, shapes)
        assert c.fa.num_states == 1024                      # the library's bucket layout:
        assert (int(c.fa.initial_state), int(c.fa.final_state), int(c.fa.dead_state)) == (0, 1022, 1023)
        # mask rows padded too (smc gathers from cum_masks: its shape is part of the program)
        assert c.fa.cum_masks.shape[0] == 512 and c.info["mask_rows"] < 512
        assert c.info["padded"] == [1024, 4096, 64, 512]
        jax.block_until_ready(gcd.backward(c.device, 48))
    assert gcd._backward._cache_size() == n0 + 1


def test_pad_automaton_pgcd_tables_unchanged(vocab):
    """β^P of the padded automaton equals the original's on the real states (tiny HMM)."""
    from hmm_distill import HMMParams
    from jaxcd import compile_regex
    from jaxcd.decoding import pgcd
    from jaxcd.automata.tensorized import pad_automaton
    fa = compile_regex(r'\[f\(a=(1|22|333)\)\]', vocab)
    p, new_id = pad_automaton(fa)
    rng = np.random.default_rng(1)
    H, V = 4, fa.vocab_size
    A = rng.dirichlet(np.ones(H), H)
    B = rng.dirichlet(np.ones(V), H)
    pi = rng.dirichlet(np.ones(H))
    hmm = HMMParams(*(jax.numpy.asarray(x, jax.numpy.float32) for x in (pi, A, B)))
    t0 = pgcd.backward(fa.to_device(), hmm, 12)
    t1 = pgcd.backward(p.to_device(), hmm, 12)
    np.testing.assert_allclose(np.asarray(t1.beta())[:, new_id], np.asarray(t0.beta()),
                               rtol=1e-5, atol=0)


def test_dfa_predicate_is_the_constraint(main_examples):
    e = main_examples[0]
    dfa = minimize(determinize(bfcl.constraint_nfa(e, "python")[0]))
    pred = dfa_predicate(dfa)
    text = bfcl.render(bfcl.answer_calls(e), "python").encode()
    assert all(pred(text[:i], False) for i in range(len(text) + 1))
    assert pred(text, True) and not pred(text[:-1], True)
    assert not pred(text[:3] + b"#", False)


def test_bootstrap_ci():
    x = np.random.default_rng(0).random(400) < 0.3
    lo, hi = bootstrap_ci(x, seed=1)
    se = np.sqrt(0.3 * 0.7 / 400)
    assert lo < x.mean() < hi
    assert abs((hi - lo) - 2 * 1.96 * se) < 0.25 * (2 * 1.96 * se)


# ---------------------------------------------------------------------------------------
# the entry point, end to end (tiny)
# ---------------------------------------------------------------------------------------
def test_budget_and_width_rules():
    from experiments import tool_calls
    a = tool_calls.parse_args(["--data", "x", "--out", "y"])
    sp = bfcl.Example("simple_python_1", "simple_python", [], [], None)
    par = bfcl.Example("parallel_1", "parallel", [], [], None)
    assert tool_calls.auto_budget(a, sp, 20) == 80            # 20 + 48 -> 68 -> 80
    assert tool_calls.auto_budget(a, par, 20) == 176          # 20 + 144 -> 164 -> 176
    assert tool_calls.auto_budget(a, par, 200) == 256         # capped


def test_entry_point_end_to_end(tmp_path, examples):
    from experiments import tool_calls
    sub = [e for e in examples if e.category == "simple_python"][:2]
    data = tmp_path / "q.jsonl"
    ans = tmp_path / "a.jsonl"
    ids = {e.id for e in sub}
    data.write_text("".join(l for l in QUESTIONS.read_text().splitlines(True)
                            if json.loads(l)["id"] in ids))
    ans.write_text("".join(l for l in ANSWERS.read_text().splitlines(True)
                           if json.loads(l)["id"] in ids))
    out = tmp_path / "out"
    # the smoke model: a random 2-layer Llama with SmolLM2's tokenizer (the real model's
    # prompts, vocabulary and constraints; cheap compiles)
    from experiments.studies import smoke_model
    tool_calls.main(["--data", str(data), "--answers", str(ans), "--format", "python",
                     "--methods", "gcd,smc-gcd", "--particles", "2", "--hmm", "none",
                     "--budget", "auto", "--margin", "4", "--limit", "2", "--seed", "0",
                     "--model", smoke_model(), "--out", str(out)])
    rows = [json.loads(l) for l in (out / "predictions.jsonl").read_text().splitlines()]
    assert len(rows) == 2 * 2 and {r["method"] for r in rows} == {"gcd", "smc-gcd"}
    byid = {e.id: e for e in sub}
    dfa = {i: minimize(determinize(bfcl.python_nfa(byid[i]))) for i in ids}
    for r in rows:
        assert set(r) >= {"id", "method", "particles", "output", "valid", "correct"}
        assert r["particles"] == 2 and r["id"] in ids
        # GCD guarantees validity; `valid` and `correct` are what the references say
        assert r["valid"] is True and dfa[r["id"]].accepts(r["output"].encode())
        assert r["correct"] == bfcl.score(byid[r["id"]], r["output"], "python")[0]
        assert r["budget"] == -(-(r["min_budget"] + 4) // 16) * 16
    # one compiled program per method serves both examples (same padded shapes, same
    # budget bucket and prompt width)
    second = [r for r in rows if r["id"] == rows[-1]["id"]]
    assert all(r["compiled"] == [] for r in second), second
    summary = json.loads((out / "summary.json").read_text())
    assert {(s["method"], s["particles"], s["n"]) for s in summary["summary"]} == \
        {("gcd", 2, 2), ("smc-gcd", 2, 2)}
    for s in summary["summary"]:
        acc = np.mean([r["correct"] for r in rows if r["method"] == s["method"]]) * 100
        assert s["accuracy_pct"] == pytest.approx(acc) and s["valid_pct"] == 100
    md = (out / "summary.md").read_text()
    assert "| python | gcd | 2 | 2 | 100.0 |" in md
    assert rows[0]["compile_s"] > 0 and rows[0]["cpu_s"] > 0     # the first call compiles


# ---------------------------------------------------------------------------------------
# the runner's savings: one prefill per prompt, one shared draw for lcd/gcd at several K
# ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_runner(tmp_path_factory):
    """A Runner around a random tiny Llama (V = 256 byte tokens, EOS = 2) and the
    constraint ``(ab|cd){1,5}`` over those tokens."""
    from test_lm_llama import write_tiny_gguf

    from experiments.runner import Runner
    from jaxcd.generation import Model
    from jaxcd.lm.loading import load_lm
    from jaxcd.vocab import Vocabulary
    path = tmp_path_factory.mktemp("tiny") / "tiny.gguf"
    write_tiny_gguf(path, "llama", tied=True, seed=3)
    lm, params = load_lm(path, tokenizer=False)[:2]
    vocab = Vocabulary.from_token_bytes([bytes([i]) for i in range(256)], eos_id=2)
    runner = Runner(Model(lm, params, None, vocab, str(path)))
    c = build_constraint(_regex_nfa(r"(ab|cd){1,5}"), vocab)
    return runner, c


def _regex_nfa(pattern):
    from jaxcd.automata.regex import regex_to_nfa
    return regex_to_nfa(pattern)


def test_prefilled_same_draws_as_own_prefill(tiny_runner):
    """decode.sample and smc.run with prefilled= (one batch-1 prefill from
    decode.prefill, broadcast to the batch) give the same tokens, validity, weights and
    evidence as with the LM's own batched prefill."""
    from jaxcd.decoding import decode, gcd, smc
    from jaxcd.lm.interface import pad_prompts
    runner, c = tiny_runner
    lm, params = runner.model.lm, runner.model.params
    prompt, budget, width = [5, 17, 99, 3, 250, 7, 40], 16, 16
    ids1, lens1 = pad_prompts([prompt], length=width)
    pre = decode.prefill(lm, params, ids1, lens1, width + budget)
    ids, lens = pad_prompts([prompt] * 3, length=width)
    fa = c.device
    tables = gcd.backward(fa, budget)
    key = jax.random.PRNGKey(7)
    a = decode.sample(key, lm, params, ids, lens, fa, tables, max_steps=budget, constrained=True)
    b = decode.sample(key, lm, params, ids, lens, fa, tables, max_steps=budget, constrained=True,
                      prefilled=pre)
    np.testing.assert_array_equal(np.asarray(a.tokens), np.asarray(b.tokens))
    assert np.asarray(a.valid).all() and np.array_equal(np.asarray(a.valid), np.asarray(b.valid))
    for f in ("logprob", "proposal_logprob"):
        np.testing.assert_allclose(np.asarray(getattr(a, f)), np.asarray(getattr(b, f)), rtol=1e-5)
    ra = smc.run(key, lm, params, ids1, lens1, fa, budget=budget, num_particles=3, tables=tables)
    rb = smc.run(key, lm, params, ids1, lens1, fa, budget=budget, num_particles=3, tables=tables,
                 prefilled=pre)
    np.testing.assert_array_equal(np.asarray(ra.tokens), np.asarray(rb.tokens))
    for f in ("log_weights", "log_Z", "ess"):
        np.testing.assert_allclose(np.asarray(getattr(ra, f)), np.asarray(getattr(rb, f)), rtol=1e-5)
    np.testing.assert_array_equal(np.asarray(ra.resampled), np.asarray(rb.resampled))
    # every output ends within 11 of the 16 steps ((ab|cd){1,5} + EOS), so the decoders'
    # early exit (every row done) was exercised by the calls above
    assert (np.asarray(a.tokens)[:, 11:] == 2).all() and (np.asarray(ra.tokens)[..., 11:] == 2).all()
    assert int(a.steps) <= 11 and int(ra.steps) <= 11
    # a prefill whose cache cannot hold the decode is refused, naming the sizes
    with pytest.raises(ValueError, match="cache of"):
        decode.sample(key, lm, params, ids, lens, fa, gcd.backward(fa, budget + 4),
                      max_steps=budget + 4, constrained=True, prefilled=pre)


def test_runner_prefill_cache_and_shared_draw(tiny_runner):
    """The runner goes through jaxcd.generate: its calls equal generate's on the same
    automaton, prompt ids and seed. The model's remembered prefill serves every method
    (one entry) and changes no output (the same calls after forgetting it). run_ks for
    lcd/gcd: one draw of max K samples; the result at K is the first valid of its first K
    samples, and the draw is the very call run(method, max K) makes."""
    import jaxcd
    from experiments.runner import stable_seed
    runner, c = tiny_runner
    prompt, budget = [5, 17, 99, 3, 250, 7, 40], 16
    runner.release(c)
    on = {m: runner.run(m, c, prompt, budget, 3, seed=1, tag="t") for m in ("lcd", "gcd", "smc-gcd")}
    assert len(runner.model._prefills) == 1                         # one prefill served all
    off = {}
    for m in on:
        runner.release(c)
        off[m] = runner.run(m, c, prompt, budget, 3, seed=1, tag="t")
        assert on[m].texts == off[m].texts and on[m].output == off[m].output, m
    g = jaxcd.generate(prompt, automaton=c.fa, method="gcd", num_samples=3, batch_size=3,
                       batching="static", budget=budget, seed=stable_seed(1, "t", "gcd", 3),
                       model=runner.model, progress=False)
    assert g.texts == on["gcd"].texts
    s = jaxcd.generate(prompt, automaton=c.fa, method="smc", budget=budget,
                       seed=stable_seed(1, "t", "smc-gcd", 3), model=runner.model,
                       smc=jaxcd.SMCConfig(num_particles=3, return_particles=True),
                       progress=False)
    assert s.particles.texts == on["smc-gcd"].texts and s.text == on["smc-gcd"].output
    # the SMC output is a particle of positive weight, the runner's `chosen`
    r = on["smc-gcd"]
    assert r.weights[r.chosen] > 0 and r.texts[r.chosen] == r.output
    # (K = 3 throughout: the programs compiled above serve every call below)
    for m in ("lcd", "gcd"):
        res = runner.run_ks(m, c, prompt, budget, [1, 2, 3], seed=1, tag="t")
        full = runner.run(m, c, prompt, budget, 3, seed=1, tag="t")
        assert res[3].texts == full.texts and res[3].output == full.output
        for K in (1, 2, 3):
            r = res[K]
            assert r.texts == full.texts[:K] and r.shared_ks == [1, 2, 3]
            first = next((i for i in range(K) if full.valid[i]), 0)
            assert r.output == full.texts[first] and r.output_valid == full.valid[first]
        assert m == "lcd" or all(res[3].valid)                # GCD: every sample valid
    # SMC runs once per K (no sharing): the result is that of a separate run
    res = runner.run_ks("smc-gcd", c, prompt, budget, [3], seed=1, tag="t")
    assert res[3].texts == on["smc-gcd"].texts and res[3].shared_ks is None
    assert runner.run_ks("smc-gcd", c, prompt, budget, [3, 3], seed=1, tag="t")[3].shared_ks is None
    runner.release(c)
    assert not runner.model._prefills


def test_runner_unconstrained_validity_is_the_regex(tiny_runner):
    """method "none" (the model alone): a sample is valid iff it ended with EOS and its
    text is in the language. `_accepted` against Python's re.fullmatch on GCD samples
    (all in the language), their mutations and truncations, and rows without EOS; the
    runner's own "none" call: one verdict per sample, the output the first valid one."""
    import random
    import re
    from experiments.runner import _accepted
    runner, c = tiny_runner
    vocab, prompt = runner.model.vocab, [5, 17, 99, 3, 250, 7, 40]
    g = runner.run("gcd", c, prompt, 16, 16, seed=2, tag="u")
    rng, rows = random.Random(0), []
    for t in g.texts:
        b = list(t.encode())
        rows += [b + [2], b + [2, 2], b]                                # ended / not ended
        for _ in range(4):
            m = list(b)
            m[rng.randrange(len(m))] = rng.choice(b"abcdx")
            rows.append(m[: rng.randrange(1, len(m) + 1)] + [2])
    n_true = 0
    for row in rows:
        want = 2 in row and bool(re.fullmatch(rb"(ab|cd){1,5}", bytes(row[: row.index(2)])))
        assert _accepted(c.dfa, vocab, row, 2) == want, row
        n_true += want
    assert 16 <= n_true < len(rows)                                     # both verdicts occur
    r = runner.run("none", c, prompt, 16, 32, seed=2, tag="u")
    assert len(r.texts) == len(r.valid) == 32
    assert r.chosen == next((i for i, v in enumerate(r.valid) if v), 0)
    assert r.output_valid == bool(r.valid[r.chosen])


def test_strip_fence_removes_one_surrounding_markdown_fence():
    from experiments.accuracy_models import strip_fence
    body = '[{"name": "f", "arguments": {"x": 1}}]'
    for wrapped in (f"```json\n{body}\n```", f"```\n{body}\n```", f"  ```json\n{body}```\n"):
        assert strip_fence(wrapped) == body, wrapped
    for same in (body, f"text ```json\n{body}\n```", f"```json\n{body}"):
        assert strip_fence(same) == same
