"""BFCL (Berkeley Function Calling Leaderboard) data for the function-calling experiments.

Data: the ``bfcl-eval`` wheel from PyPI (``pip download --no-deps``, pinned to
:data:`WHEEL_VERSION`), unpacked under ``<jaxcd cache>/data/bfcl_eval-VERSION/``. The
question files ``bfcl_eval/data/BFCL_v4_<category>.json`` are JSON Lines despite the
name; ground truth is in ``bfcl_eval/data/possible_answer/``. ``bfcl:<category>``
names a category's file (fetched on first use).

Per example this module builds

- the prompt, with :func:`jaxcd.generation.format_prompt` (the chat template ``jaxcd
  generate`` uses): a system message that states the output format, the tools (each
  ``{"name", "description", "parameters"}`` with the parameters converted to JSON
  Schema by :func:`jaxcd.automata.bfcl.function_to_schema`) and the user turn;
- the constraint, as a byte NFA:

  * ``json``: a JSON array of ``{"name": <const>, "arguments": <that function's
    parameters schema>}`` (``anyOf`` over the example's functions; xLAM's format),
    built by jaxcd's JSON Schema builder (default whitespace ``[ ]?``);
  * ``python``: ``[f(a=1, b='x'), g(...)]`` — composed from one NFA per function
    (name, ``(``, the arguments in the schema's order separated by ``, ``, required
    ones mandatory, ``)``) and per argument value a Python literal NFA
    (:func:`python_value_nfa`: strings in single quotes, numbers, ``True``/``False``,
    ``None``, lists, dicts with the declared keys, enums/consts as their ``repr``;
    a value without a type is a string, number, boolean, ``None`` or a flat list/dict
    of those). BFCL's ``any`` is a string in both formats (:func:`function_to_schema`:
    BFCL's checker accepts only a ``str`` there).

  Categories with a ground truth need at least one call; the irrelevance categories
  also allow ``[]`` (no call — the right answer there).

Scoring uses BFCL's own AST checker (:func:`load_checker`): its module imports every
model handler through ``bfcl_eval.constants.model_config`` for one mapping
(``MODEL_CONFIG_MAPPING[model].underscore_to_dot``); that module is replaced by a stub
holding a mapping for our one model name (``underscore_to_dot = False``: our function
names keep their dots), everything else is BFCL's code, unchanged. The outputs are
converted to the checker's model-output format ``[{func_name: {arg: value}}]``
(:func:`parse_output`): JSON with :mod:`json`, Python with :mod:`ast` (the same
resolution rules as BFCL's ``resolve_ast_call``).
"""

from __future__ import annotations

import ast
import importlib
import json
import subprocess
import sys
import types
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jaxcd.automata.bfcl import function_to_schema as _function_to_schema
from jaxcd.automata.fsa import NFA
from jaxcd.automata.pycall import value_regex
from jaxcd.automata.regex import regex_to_nfa


def function_to_schema(function: dict) -> dict:
    """The arguments' JSON Schema as the experiments constrain them: ``any`` is a string,
    because BFCL's AST checker reads ``any`` as Python ``str`` (``PYTHON_TYPE_MAPPING``)
    and rejects any other value there."""
    return _function_to_schema(function, any_as_string=True)


WHEEL = "bfcl-eval"
WHEEL_VERSION = "2026.3.23"
MODEL_NAME = "jaxcd-constrained"

#: the categories the experiments report (issue 12)
MAIN_CATEGORIES = ("simple_python", "multiple", "parallel", "parallel_multiple", "live_multiple")
#: every single-turn category (all load and run; the irrelevance ones have no ground truth)
SINGLE_TURN = MAIN_CATEGORIES + ("live_simple", "live_parallel", "live_parallel_multiple",
                                 "simple_java", "simple_javascript", "irrelevance",
                                 "live_irrelevance", "live_relevance")
NO_CALL_CATEGORIES = ("irrelevance", "live_irrelevance")

SYSTEM = {
    "json": ("You are an expert in composing function calls. You are given a question and "
             "a set of possible functions. Answer with the function call(s) that answer the "
             "question, as a JSON array of objects "
             '[{"name": "func_name", "arguments": {"param": value}}], and nothing else.'),
    "python": ("You are an expert in composing function calls. You are given a question and "
               "a set of possible functions. Answer with the function call(s) that answer the "
               "question, as a Python list [func_name(param1=value1, param2=value2), ...], "
               "and nothing else."),
}


# ---------------------------------------------------------------------------------------
# data
# ---------------------------------------------------------------------------------------
def data_root(fetch: bool = True) -> Path:
    """``<cache>/data/bfcl_eval-VERSION`` (the unpacked wheel); fetched from PyPI with
    ``pip download --no-deps`` on first use."""
    from jaxcd.model_files import cache_dir
    root = cache_dir() / "data" / f"bfcl_eval-{WHEEL_VERSION}"
    if (root / "bfcl_eval" / "data").is_dir():
        return root
    if not fetch:
        raise FileNotFoundError(f"BFCL data not found under {root}")
    dl = root.parent / "wheels"
    dl.mkdir(parents=True, exist_ok=True)
    whl = sorted(dl.glob(f"bfcl_eval-{WHEEL_VERSION}-*.whl"))
    if not whl:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary",
                        ":all:", "-d", str(dl), f"{WHEEL}=={WHEEL_VERSION}"], check=True,
                       stdout=subprocess.DEVNULL)
        whl = sorted(dl.glob(f"bfcl_eval-{WHEEL_VERSION}-*.whl"))
    tmp = root.with_suffix(".tmp")
    with zipfile.ZipFile(whl[0]) as z:
        z.extractall(tmp)
    if not root.exists():
        tmp.replace(root)
    return root


def category_file(category: str, answers: bool = False) -> Path:
    d = data_root() / "bfcl_eval" / "data"
    p = (d / "possible_answer" if answers else d) / f"BFCL_v4_{category}.json"
    if not p.exists():
        raise FileNotFoundError(f"no BFCL file for category {category!r} ({p})")
    return p


def resolve(spec: str, answers: bool = False) -> Path | None:
    """A path, or ``bfcl:<category>`` (the category's questions / possible answers;
    ``None`` for answers of a category without any)."""
    if spec.startswith("bfcl:"):
        cat = spec[5:]
        try:
            return category_file(cat, answers)
        except FileNotFoundError:
            if answers:
                return None
            raise
    return Path(spec)


def load_jsonl(path: str | Path) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def category_of(example_id: str) -> str:
    """``simple_python_12`` -> ``simple_python``; ``live_multiple_3-1-0`` -> ``live_multiple``."""
    return example_id.rsplit("_", 1)[0]


@dataclass
class Example:
    id: str
    category: str
    question: list          # the single turn's messages
    functions: list         # BFCL function documents
    answer: list | None     # BFCL ground truth ([{func: {arg: [options]}}]) or None

    @property
    def language(self) -> str:
        return {"simple_java": "java", "simple_javascript": "javascript"}.get(self.category,
                                                                              "python")


def load_examples(data: str | Path, answers: str | Path | None = None) -> list[Example]:
    rows = load_jsonl(data)
    gt = {}
    if answers is not None:
        gt = {r["id"]: r["ground_truth"] for r in load_jsonl(answers)}
    out = []
    for r in rows:
        q = r["question"]
        turn = q[0] if q and isinstance(q[0], list) else q
        out.append(Example(r["id"], category_of(r["id"]), turn, r["function"], gt.get(r["id"])))
    return out


# ---------------------------------------------------------------------------------------
# prompts
# ---------------------------------------------------------------------------------------
def tool_docs(ex: Example) -> list[dict]:
    return [{"name": f["name"], "description": f.get("description", ""),
             "parameters": function_to_schema(f)} for f in ex.functions]


def prompt_ids(ex: Example, tokenizer, fmt: str) -> list[int]:
    """Token ids of the example's prompt (system: format instruction + any system turns;
    the tools in the system message, as ``jaxcd generate`` puts them)."""
    from jaxcd.generation import format_prompt
    system = [SYSTEM[fmt]] + [m["content"] for m in ex.question if m["role"] == "system"]
    user = "\n".join(m["content"] for m in ex.question if m["role"] != "system")
    return format_prompt(tokenizer, user, system="\n\n".join(system), tools=tool_docs(ex))


# ---------------------------------------------------------------------------------------
# constraints
# ---------------------------------------------------------------------------------------
def json_schema_for(ex: Example) -> dict:
    """JSON Schema of the JSON format: an array of ``{"name", "arguments"}`` objects."""
    items = [{"type": "object",
              "properties": {"name": {"const": f["name"]}, "arguments": function_to_schema(f)},
              "required": ["name", "arguments"], "additionalProperties": False}
             for f in ex.functions]
    return {"type": "array", "items": items[0] if len(items) == 1 else {"anyOf": items},
            "minItems": 0 if ex.category in NO_CALL_CATEGORIES else 1}


_SCALAR_KEYS = ("type", "enum", "const", "minLength", "maxLength")
_ANY_SCALAR = {"anyOf": [{"type": "string"}, {"type": "number"}, {"type": "boolean"},
                         {"type": "null"}]}


def _py_string(s: str) -> str:
    """A Python single-quoted literal within the constraint's string language."""
    out = []
    for ch in s:
        if ch in "'\\":
            out.append("\\" + ch)
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\t":
            out.append("\\t")
        else:
            out.append(ch)
    return "'" + "".join(out) + "'"


def py_literal(v: Any) -> str:
    """The canonical Python literal of a JSON value in the ``python`` format."""
    if isinstance(v, str):
        return _py_string(v)
    if isinstance(v, bool) or v is None:
        return repr(v)
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(py_literal(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{_py_string(str(k))}: {py_literal(x)}" for k, x in v.items()) + "}"
    raise TypeError(f"no Python literal for {type(v).__name__}")


def python_value_nfa(nfa: NFA, src: int, dst: int, schema: Any, where: str = "",
                     depth: int = 3) -> None:
    """Add paths ``src -> dst`` spelling the Python literals allowed by ``schema``."""
    if not isinstance(schema, dict):
        schema = {}
    if "const" in schema:
        nfa.add_string(src, dst, py_literal(schema["const"]))
        return
    if "enum" in schema:
        for v in schema["enum"]:
            nfa.add_string(src, dst, py_literal(v))
        return
    for key in ("anyOf", "oneOf"):
        if isinstance(schema.get(key), list):
            for i, s in enumerate(schema[key]):
                python_value_nfa(nfa, src, dst, s, f"{where}/{key}/{i}", depth)
            return
    t = schema.get("type")
    if isinstance(t, list):
        for x in t:
            python_value_nfa(nfa, src, dst, {**schema, "type": x}, where, depth)
        return
    if t is None:                                   # any: a scalar or a flat list/dict
        python_value_nfa(nfa, src, dst, _ANY_SCALAR, where, depth)
        if depth > 0:
            python_value_nfa(nfa, src, dst, {"type": "array", "items": _ANY_SCALAR}, where, 0)
            python_value_nfa(nfa, src, dst, {"type": "object", "additionalProperties":
                                             _ANY_SCALAR}, where, 0)
        return
    if t in ("string", "integer", "number", "boolean", "null"):
        sub = {k: schema[k] for k in _SCALAR_KEYS if k in schema}
        s, acc = nfa.embed(regex_to_nfa(value_regex(sub, where)))
        nfa.add_epsilon(src, s)
        for a in acc:
            nfa.add_epsilon(a, dst)
        return
    if t in ("array", "object") and depth < 0:
        raise ValueError(f"{where}: values nested too deeply for the Python format")
    if t == "array":
        item = schema.get("items", {})
        body, more = nfa.add_state(), nfa.add_state()
        nfa.add_string(src, body, "[")
        nfa.add_string(body, dst, "]")
        python_value_nfa(nfa, body, more, item, where + "/items", depth - 1)
        sep = nfa.add_state()
        nfa.add_string(more, sep, ", ")
        python_value_nfa(nfa, sep, more, item, where + "/items", depth - 1)
        nfa.add_string(more, dst, "]")
        return
    if t == "object":
        props = schema.get("properties")
        if isinstance(props, dict) and props:
            _keyword_sequence(nfa, src, dst, props, set(schema.get("required") or []),
                              lambda k: _py_string(k) + ": ", "{", "}", where, depth - 1)
            return
        # a free dict: string keys, values from additionalProperties (any scalar by default)
        val = schema.get("additionalProperties")
        val = val if isinstance(val, dict) and val else _ANY_SCALAR
        body, more, sep = nfa.add_state(), nfa.add_state(), nfa.add_state()
        nfa.add_string(src, body, "{")
        nfa.add_string(body, dst, "}")
        for a in (body, sep):
            k = nfa.add_state()
            python_value_nfa(nfa, a, k, {"type": "string"}, where, 0)
            c = nfa.add_state()
            nfa.add_string(k, c, ": ")
            python_value_nfa(nfa, c, more, val, where + "/additionalProperties", depth - 1)
        nfa.add_string(more, sep, ", ")
        nfa.add_string(more, dst, "}")
        return
    raise ValueError(f"{where}: unsupported type {t!r} in a Python-format argument")


def _keyword_sequence(nfa: NFA, src: int, dst: int, props: dict, required: set, label,
                      open_: str, close: str, where: str, depth: int) -> None:
    """``open_ label(k1) v1, label(k2) v2 close`` over ``props`` in order; the keys in
    ``required`` must appear, the others may be left out (pycall's argument scheme)."""
    first = nfa.add_state()
    nfa.add_string(src, first, open_)
    # states[i][e]: before property i, e = whether one was written already
    states = [[first, nfa.add_state()]] + [[nfa.add_state(), nfa.add_state()] for _ in props]
    for i, (k, sub) in enumerate(props.items()):
        for e in (0, 1):
            a = states[i][e]
            if k not in required:
                nfa.add_epsilon(a, states[i + 1][e])
            mid = nfa.add_state()
            nfa.add_string(a, mid, (", " if e else "") + label(k))
            python_value_nfa(nfa, mid, states[i + 1][1], sub, f"{where}/properties/{k}", depth)
    for e in (0, 1):
        nfa.add_string(states[-1][e], dst, close)


def python_call_nfa(nfa: NFA, src: int, dst: int, function: dict) -> None:
    """``name(arg=value, ...)`` for one BFCL function (arguments in the schema's order)."""
    params = function_to_schema(function)
    props = params.get("properties") or {}
    _keyword_sequence(nfa, src, dst, props, set(params.get("required") or []) & set(props),
                      lambda k: f"{k}=", f"{function['name']}(", ")", f"/{function['name']}", 3)


def python_nfa(ex: Example) -> NFA:
    """``[call, call, ...]`` over the example's functions (``[]`` allowed only for the
    irrelevance categories)."""
    nfa = NFA()
    start, body, more, sep, end = (nfa.add_state() for _ in range(5))
    nfa.accepting.add(end)
    nfa.start = start
    nfa.add_string(start, body, "[")
    if ex.category in NO_CALL_CATEGORIES:
        nfa.add_string(body, end, "]")
    for a in (body, sep):
        for f in ex.functions:
            python_call_nfa(nfa, a, more, f)
    nfa.add_string(more, sep, ", ")
    nfa.add_string(more, end, "]")
    return nfa


def constraint_nfa(ex: Example, fmt: str) -> tuple[NFA, dict]:
    """The byte NFA of the example's output format and what was built (``info``)."""
    if fmt == "json":
        from jaxcd.automata.json_schema import schema_to_nfa
        from jaxcd.errors import UnsupportedSchemaError
        schema = json_schema_for(ex)
        try:
            nfa, _ = schema_to_nfa(schema, None, True, 3)
            return nfa, {"strict": True}
        except UnsupportedSchemaError as e:           # keep going, say what was dropped
            nfa, _ = schema_to_nfa(schema, None, False, 3)
            return nfa, {"strict": False, "dropped": str(e)}
    if fmt == "python":
        return python_nfa(ex), {"strict": True}
    raise ValueError(f"format must be 'json' or 'python', got {fmt!r}")


# ---------------------------------------------------------------------------------------
# ground truth rendering (tests, budget calibration)
# ---------------------------------------------------------------------------------------
def answer_calls(ex: Example, choice: int = 0) -> list[tuple[str, dict]]:
    """One concrete call list from the ground truth: for every argument its ``choice``-th
    listed option (clipped), arguments whose option is ``""`` (= may be omitted) left
    out, in the function schema's argument order (nested dicts too)."""
    calls = []
    for call in ex.answer or []:
        (name, args), = call.items()
        f = next(f for f in ex.functions if f["name"] == name)
        schema = function_to_schema(f)
        vals = {}
        for k, sub in (schema.get("properties") or {}).items():
            if k in args:
                opts = args[k]
                if not opts:
                    continue
                v = opts[min(choice, len(opts) - 1)]
                if v == "" and "" in opts:
                    continue
                vals[k] = _option(v, sub)
        calls.append((name, vals))
    return calls


def _option(v, schema):
    """Nested dict answers list options per key: take the first of each, in the
    schema's key order."""
    if isinstance(v, dict):
        props = (schema or {}).get("properties") or {}
        keys = [k for k in props if k in v] + [k for k in v if k not in props]
        out = {}
        for k in keys:
            x = v[k]
            if isinstance(x, list) and x:
                if x[0] == "":
                    continue
                x = x[0]
            out[k] = _option(x, props.get(k))
        return out
    return v


def render(calls: list[tuple[str, dict]], fmt: str) -> str:
    if fmt == "json":
        return json.dumps([{"name": n, "arguments": a} for n, a in calls], ensure_ascii=False)
    return "[" + ", ".join(f"{n}(" + ", ".join(f"{k}={py_literal(v)}" for k, v in a.items())
                           + ")" for n, a in calls) + "]"


# ---------------------------------------------------------------------------------------
# parsing and scoring
# ---------------------------------------------------------------------------------------
def _resolve_value(node):
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_resolve_value(node.operand)
    if isinstance(node, (ast.List, ast.Tuple)):
        return [_resolve_value(v) for v in node.elts]
    if isinstance(node, ast.Dict):
        return {_resolve_value(k): _resolve_value(v) for k, v in zip(node.keys, node.values)}
    if isinstance(node, ast.Name):
        return node.id
    raise ValueError(f"unsupported value {ast.dump(node)[:60]}")


def _call_name(f) -> str:
    parts = []
    while isinstance(f, ast.Attribute):
        parts.append(f.attr)
        f = f.value
    if not isinstance(f, ast.Name):
        raise ValueError("not a call of a (dotted) name")
    parts.append(f.id)
    return ".".join(reversed(parts))


def parse_output(text: str, fmt: str) -> list[dict]:
    """Model output -> BFCL's model-output format ``[{func_name: {arg: value}}]``.
    Raises ``ValueError`` when the text is not a call list."""
    if fmt == "json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"not JSON: {e}") from None
        if not isinstance(data, list):
            raise ValueError("not a JSON array")
        out = []
        for c in data:
            if not (isinstance(c, dict) and isinstance(c.get("name"), str)
                    and isinstance(c.get("arguments"), dict)):
                raise ValueError("an element is not {name, arguments}")
            out.append({c["name"]: c["arguments"]})
        return out
    try:
        tree = ast.parse(text.strip(), mode="eval").body
    except SyntaxError as e:
        raise ValueError(f"not Python: {e}") from None
    elts = [tree] if isinstance(tree, ast.Call) else getattr(tree, "elts", None)
    if elts is None:
        raise ValueError("not a list of calls")
    out = []
    for el in elts:
        if not isinstance(el, ast.Call) or el.args:
            raise ValueError("an element is not a keyword-only call")
        out.append({_call_name(el.func): {k.arg: _resolve_value(k.value) for k in el.keywords}})
    return out


_CHECKER = None


def load_checker():
    """BFCL's ``ast_checker`` function and its ``Language`` enum, imported from the
    unpacked wheel with ``bfcl_eval.constants.model_config`` replaced by a stub (the
    real one imports every model handler and their API clients)."""
    global _CHECKER
    if _CHECKER is not None:
        return _CHECKER
    root = data_root()
    stub_name = "bfcl_eval.constants.model_config"
    if stub_name not in sys.modules:
        stub = types.ModuleType(stub_name)
        cfg = types.SimpleNamespace(underscore_to_dot=False)
        stub.MODEL_CONFIG_MAPPING = {MODEL_NAME.replace("_", "/"): cfg}
        sys.modules[stub_name] = stub
    if str(root) not in sys.path:
        sys.path.append(str(root))
    mod = importlib.import_module("bfcl_eval.eval_checker.ast_eval.ast_checker")
    enums = importlib.import_module("bfcl_eval.constants.enums")
    if not str(Path(mod.__file__).resolve()).startswith(str(root.resolve())):
        raise ImportError(f"bfcl_eval imported from {mod.__file__}, not from {root}")
    _CHECKER = (mod.ast_checker, enums.Language)
    return _CHECKER


def _stringify(v):
    """Java/JavaScript categories: BFCL's checker reads argument values as source text."""
    if isinstance(v, str):
        return v
    if isinstance(v, bool):
        return "true" if v else "false"
    return json.dumps(v)


def score(ex: Example, text: str, fmt: str) -> tuple[bool | None, str]:
    """``(correct, why)`` by BFCL's AST checker; ``None`` when the example has no ground
    truth (for the irrelevance categories: correct iff the output parses to no call)."""
    try:
        calls = parse_output(text, fmt)
    except ValueError as e:
        return (False if ex.answer is not None or ex.category in NO_CALL_CATEGORIES else None,
                f"unparsable: {e}")
    if ex.category in NO_CALL_CATEGORIES:
        return len(calls) == 0, "no call" if not calls else "called a function"
    if ex.answer is None:
        return None, "no ground truth"
    ast_checker, Language = load_checker()
    lang = {"python": Language.PYTHON, "java": Language.JAVA,
            "javascript": Language.JAVASCRIPT}[ex.language]
    if lang != Language.PYTHON:
        calls = [{n: {k: _stringify(v) for k, v in a.items()}} for c in calls
                 for n, a in c.items()]
    try:
        res = ast_checker(ex.functions, calls, ex.answer, lang, ex.category, MODEL_NAME)
    except Exception as e:                           # the checker's own failures: wrong
        return False, f"checker error: {type(e).__name__}: {e}"
    return bool(res["valid"]), "; ".join(map(str, res.get("error", [])))[:200]
