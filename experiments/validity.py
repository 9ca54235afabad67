"""Validity of sampled outputs under GCD vs LCD at tight and generous budgets.

For every constraint of the public workload (``tests/data/workload``) and a short
natural prompt asking for that kind of output (chat template), we sample N outputs
(temperature 1) from SmolLM2-135M-Instruct (JAX, float32) at budgets
``{min_budget, min_budget + 4, generous}`` with ``--method gcd`` and ``lcd``.

An output is **valid** iff it emitted EOS within the budget and its text passes an
independent check: ``re.fullmatch`` for regexes, ``json.loads`` + ``jsonschema.validate``
for JSON schemas (never jaxcd's own machinery). We also check that this verdict agrees
with jaxcd's own flag (the automaton ended in ``⊥``) on every sample, that every
sample's length (EOS included) is within the budget and everything after EOS is EOS
padding, and that the text decoded by jaxcd's byte-level vocabulary equals the text
``transformers``' own tokenizer decodes from the same ids (so the byte decoding is
not a jaxcd-only point of failure).

Decoding uses :func:`jaxcd.decoding.decode.sample_stepwise` with a fixed batch (N), prompt
width and ``max_len``, so the LM's prefill and step compile once for the whole run;
only the small mask/sample/advance function is compiled per constraint and budget.

Usage::

    HF_HUB_OFFLINE=1 python experiments/validity.py [--n 16] [--quick] [--ws compact|default]

Writes ``experiments/results/validity.json`` and ``validity.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
WORKLOAD = ROOT / "tests" / "data" / "workload"
RESULTS = ROOT / "experiments" / "results"

PROMPTS = {
    "re_integer": "Pick a random integer (it may be negative) and reply with the number only.",
    "re_iso_date": "On what date did Apollo 11 land on the Moon? Reply with the date only, "
                   "formatted as YYYY-MM-DD.",
    "re_email": "Make up an email address for a fictional person called Jane Doe. Reply with "
                "the address only.",
    "re_phone": "Make up a US phone number formatted like (555) 123-4567. Reply with the "
                "number only.",
    "re_func_call": "Write the Python call get_weather(city='...', unit='...') that asks for "
                    "the weather in Paris in celsius. Reply with the call only.",
    "js_x_int": 'Return a JSON object with a single integer field "x". Reply with JSON only.',
    "js_tool_call": "Tools: get_weather, search_web, send_email. User: what will the weather "
                    "be in Paris for the next 3 days, in celsius, without hourly details? "
                    'Reply with only a JSON object {"name": ..., "arguments": {"city": ..., '
                    '"unit": ..., "days": ..., "include_hourly": ...}}.',
    "js_nested_order": "Create a JSON order with an order_id, a customer (name and vip flag) "
                       "and up to three items (sku, qty, price). Reply with JSON only.",
    "js_recipe": "Write a short tomato soup recipe as a JSON object with title, servings, "
                 "vegetarian, ingredients (name, amount, unit) and steps. Reply with JSON only.",
    "js_person_optional": "Describe Grace Hopper as a JSON object with name, age, address "
                          "(city) and a list of tags. Reply with JSON only.",
    "js_product_nullable": "Describe one product of a garden store as a JSON object with id, "
                           "name, in_stock, price, discount (a number or null) and category. "
                           "Reply with JSON only.",
}


def generous_budget(min_budget: int) -> int:
    return max(64, 4 * min_budget)


def load_workload():
    spec = json.loads((WORKLOAD / "workload.json").read_text())
    out = []
    for c in spec["constraints"]:
        src = (WORKLOAD / c["file"]).read_text()
        if c["kind"] == "regex":
            src = src.strip("\n")
        out.append(dict(name=c["name"], kind=c["kind"], source=src, target=c["target"]))
    return out


def make_checker(kind: str, source: str):
    """Independent validity check of a decoded text (no jaxcd code involved)."""
    if kind == "regex":
        pattern = re.compile(source)
        return lambda text: pattern.fullmatch(text) is not None
    import jsonschema

    schema = json.loads(source)
    validator = jsonschema.validators.validator_for(schema)(schema)

    def check(text):
        try:
            value = json.loads(text)
        except ValueError:
            return False
        return validator.is_valid(value)

    return check


def decode_row(row, eos, vocab):
    """(text or None if not UTF-8, ended, num_tokens incl. EOS, body ids, padding ok)."""
    row = list(row)
    ended = eos in row
    body = row[: row.index(eos)] if ended else row
    pad_ok = all(t == eos for t in row[len(body):])
    try:
        text = vocab.decode_bytes(body).decode("utf-8")
    except UnicodeDecodeError:
        text = None
    return text, ended, len(body) + (1 if ended else 0), body, pad_ok


def load_hf_tokenizer(path):
    """transformers' tokenizer for the same GGUF (None if unavailable)."""
    try:
        from transformers import AutoTokenizer
        path = Path(path)
        return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    except Exception as e:                                   # noqa: BLE001
        print(f"(no transformers tokenizer cross-check: {type(e).__name__}: {e})")
        return None


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=16, help="samples per (constraint, budget, method)")
    ap.add_argument("--methods", nargs="+", default=["gcd", "lcd"], choices=["gcd", "lcd"])
    ap.add_argument("--constraints", nargs="*", default=None, help="subset of workload names")
    ap.add_argument("--ws", choices=["compact", "default"], default="compact",
                    help="JSON whitespace: compact (none, as the workload targets) or "
                         "outlines-core's default [ ]?")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--quick", action="store_true", help="4 samples, budgets {min, min+4}")
    ap.add_argument("--out", default=str(RESULTS / "validity"))
    args = ap.parse_args(argv)
    if args.quick:
        args.n = min(args.n, 4)

    import jax

    from jaxcd.decoding.decode import sample_stepwise, tables_for
    from jaxcd.generation import build_constraint, load_model
    from jaxcd.lm.interface import pad_prompts

    t_start = time.perf_counter()
    model = load_model()
    lm, params, vocab = model.lm, model.params, model.vocab
    hf_tok = load_hf_tokenizer(model.path)
    eos = lm.eos_token_id
    ws = "" if args.ws == "compact" else None
    items = load_workload()
    if args.constraints:
        unknown = set(args.constraints) - {c["name"] for c in items}
        if unknown:
            raise SystemExit(f"unknown constraint(s): {sorted(unknown)}")
        items = [c for c in items if c["name"] in args.constraints]

    # compile every constraint; fix prompt width and max_len for the whole run
    for c in items:
        t0 = time.perf_counter()
        if c["kind"] == "regex":
            fa = build_constraint(vocab, regex=c["source"])
        else:
            fa = build_constraint(vocab, closed_objects=False, schema=c["source"], whitespace_pattern=ws)
        c["compile_s"] = time.perf_counter() - t0
        c["fa"] = fa.to_device()
        c["min_budget"] = fa.min_budget
        b = [fa.min_budget, fa.min_budget + 4]
        if not args.quick:
            b.append(generous_budget(fa.min_budget))
        c["budgets"] = b
        c["prompt_ids"] = model.encode_prompt(PROMPTS[c["name"]])
        c["check"] = make_checker(c["kind"], c["source"])
    P = -(-max(len(c["prompt_ids"]) for c in items) // 8) * 8
    max_budget = max(max(c["budgets"]) for c in items)
    max_len = P + max_budget
    print(f"model {lm!r}; batch {args.n}, prompt width {P}, max_len {max_len}; "
          f"JSON whitespace: {args.ws}", flush=True)

    rows = []
    for ci, c in enumerate(items):
        ids, lens = pad_prompts([c["prompt_ids"]] * args.n, pad_id=getattr(lm, "pad_token_id", 0),
                                length=P)
        for budget in c["budgets"]:
            for method in args.methods:
                tables = tables_for(c["fa"], method, budget)
                key = jax.random.PRNGKey(args.seed * 100003 + ci * 1009 + budget)
                t0 = time.perf_counter()
                out = sample_stepwise(key, lm, params, ids, lens, c["fa"], tables, budget=budget,
                                      max_len=max_len, constrained=True,
                                      temperature=args.temperature)
                toks = np.asarray(out.tokens)
                dt = time.perf_counter() - t0
                flags = np.asarray(out.valid).tolist()
                n_valid = n_cut = n_bad_text = n_disagree = 0
                n_over = n_bad_pad = n_hf_mismatch = 0
                lengths, examples, disagreements = [], [], []
                assert toks.shape == (args.n, budget), toks.shape
                for r, flag in zip(toks.tolist(), flags):
                    text, ended, n_tok, body, pad_ok = decode_row(r, eos, vocab)
                    n_over += n_tok > budget
                    n_bad_pad += not pad_ok
                    if hf_tok is not None and text is not None:
                        hf_text = hf_tok.decode(body, skip_special_tokens=False,
                                                clean_up_tokenization_spaces=False)
                        if hf_text != text:
                            n_hf_mismatch += 1
                            disagreements.append({"text": text, "hf_text": hf_text})
                    ok = (ended and n_tok <= budget and pad_ok and text is not None
                          and c["check"](text))
                    n_valid += ok
                    n_cut += not ended
                    n_bad_text += ended and not ok
                    lengths.append(n_tok)
                    if ok != bool(flag):
                        n_disagree += 1
                        disagreements.append({"text": text, "ended": ended, "jaxcd": bool(flag),
                                              "independent": ok})
                    if len(examples) < 3:
                        examples.append(text if text is not None else repr(vocab.decode_bytes(r)))
                rec = dict(constraint=c["name"], kind=c["kind"], min_budget=c["min_budget"],
                           budget=budget, budget_label=("min" if budget == c["min_budget"] else
                                                        "min+4" if budget == c["min_budget"] + 4
                                                        else "generous"),
                           method=method, n=args.n, valid=n_valid,
                           valid_rate=n_valid / args.n, cut_off=n_cut, ended_invalid=n_bad_text,
                           disagreements=n_disagree, over_budget=n_over, bad_padding=n_bad_pad,
                           hf_text_mismatch=n_hf_mismatch,
                           max_tokens=int(max(lengths)), mean_tokens=float(np.mean(lengths)),
                           seconds=round(dt, 2), examples=examples,
                           disagreement_samples=disagreements[:5])
                rows.append(rec)
                print(f"{c['name']:20s} b={budget:3d} ({rec['budget_label']:8s}) {method}: "
                      f"valid {n_valid:2d}/{args.n}  cut-off {n_cut:2d}  ended-invalid "
                      f"{n_bad_text}  disagree {n_disagree}  hf-mismatch {n_hf_mismatch}  "
                      f"len {rec['mean_tokens']:5.1f}/{rec['max_tokens']}  "
                      f"{dt:5.1f}s  e.g. {examples[0]!r}", flush=True)

    summary = {}
    for method in args.methods:
        for label in ("min", "min+4", "generous"):
            sel = [r for r in rows if r["method"] == method and r["budget_label"] == label]
            if sel:
                summary[f"{method}/{label}"] = {
                    "valid": sum(r["valid"] for r in sel), "n": sum(r["n"] for r in sel),
                    "rate": sum(r["valid"] for r in sel) / sum(r["n"] for r in sel),
                    "cut_off": sum(r["cut_off"] for r in sel)}
    total_disagree = sum(r["disagreements"] for r in rows)
    gcd_rows = [r for r in rows if r["method"] == "gcd"]
    checks = {
        "gcd_all_valid": all(r["valid"] == r["n"] for r in gcd_rows),
        "gcd_invalid_samples": sum(r["n"] - r["valid"] for r in gcd_rows),
        "over_budget_samples": sum(r["over_budget"] for r in rows),
        "bad_padding_samples": sum(r["bad_padding"] for r in rows),
        "hf_text_mismatches": sum(r["hf_text_mismatch"] for r in rows),
        "hf_cross_check": hf_tok is not None,
        "lcd_tight_failure_rate": (lambda sel: 1 - sum(r["valid"] for r in sel) /
                                   max(1, sum(r["n"] for r in sel)))(
            [r for r in rows if r["method"] == "lcd" and r["budget_label"] in ("min", "min+4")]),
    }
    result = {
        "setup": {"model": repr(lm), "n": args.n, "temperature": args.temperature,
                  "seed": args.seed, "json_whitespace": args.ws, "prompt_width": P,
                  "max_len": max_len, "quick": args.quick, "machine": platform.platform(),
                  "cpus": os.cpu_count(), "jax": jax.__version__,
                  "backend": jax.default_backend(),
                  "wall_s": round(time.perf_counter() - t_start, 1)},
        "prompts": {c["name"]: PROMPTS[c["name"]] for c in items},
        "summary": summary, "disagreements_total": total_disagree, "checks": checks,
        "rows": rows}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=1, ensure_ascii=False))
    md = to_markdown(result, args.methods)
    out.with_suffix(".md").write_text(md)
    print()
    print(md)


def to_markdown(result, methods):
    s = result["setup"]
    lines = [f"# Validity of sampled outputs: GCD vs LCD",
             "",
             f"{s['model']}, {s['n']} samples per cell, temperature {s['temperature']}, "
             f"seed {s['seed']}, JSON whitespace {s['json_whitespace']}, backend {s['backend']}. "
             "Valid = EOS within the budget and the text passes `re.fullmatch` / "
             "`jsonschema` (independent of jaxcd). `cut` = no EOS within the budget. "
             f"Disagreements with jaxcd's own flag: {result['disagreements_total']}; "
             f"samples over budget: {result['checks']['over_budget_samples']}; bad EOS padding: "
             f"{result['checks']['bad_padding_samples']}; texts differing from transformers' "
             f"tokenizer decode: {result['checks']['hf_text_mismatches']}"
             + ("" if result["checks"]["hf_cross_check"] else " (cross-check unavailable)")
             + f". Wall time {s['wall_s']} s.", ""]
    by = {}
    for r in result["rows"]:
        by.setdefault((r["constraint"], r["budget"]), {})[r["method"]] = r
    head = "| constraint | min | budget | " + " | ".join(
        f"{m.upper()} valid | {m.upper()} cut" for m in methods) + " | LCD mean len |"
    lines += [head, "|" + "---|" * (3 + 2 * len(methods) + 1)]
    for (name, budget), d in by.items():
        any_r = next(iter(d.values()))
        cells = []
        for m in methods:
            r = d.get(m)
            cells += ([f"{100 * r['valid_rate']:.0f}% ({r['valid']}/{r['n']})", str(r["cut_off"])]
                      if r else ["", ""])
        lcd_len = f"{d['lcd']['mean_tokens']:.1f}" if "lcd" in d else ""
        lines.append(f"| {name} | {any_r['min_budget']} | {budget} ({any_r['budget_label']}) | "
                     + " | ".join(cells) + f" | {lcd_len} |")
    lines += ["", "Totals:", ""]
    for k, v in result["summary"].items():
        lines.append(f"- {k}: {v['valid']}/{v['n']} valid ({100 * v['rate']:.1f}%), "
                     f"{v['cut_off']} cut off")
    ch = result["checks"]
    lines += ["", f"GCD: {'all' if ch['gcd_all_valid'] else 'NOT all'} outputs valid and within "
              f"budget ({ch['gcd_invalid_samples']} invalid). LCD at tight budgets (min, min+4): "
              f"{100 * ch['lcd_tight_failure_rate']:.1f}% of outputs fail."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
