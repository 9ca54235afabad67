"""Token byte strings: exact round trips against the tokenizer itself."""

import numpy as np
import pytest

from jaxcd import Vocabulary, compile_regex
from jaxcd.errors import VocabularyError

TEXTS = ["Hello, world!", "naïve café — 日本語のテキスト 😀🎉", '{"a": [1, 2.5e-3, null]}',
         "def f(x):\n\treturn x ** 2  # comment", "   many   spaces\n\n\nand newlines",
         "Ελληνικά, русский, עברית, العربية", "emoji 👩‍👩‍👧 zwj", "\u00e9\u0301 combining"]


def test_byte_level_round_trip(smol_tokenizer, smol_vocab):
    assert smol_vocab.vocab_size == 49152 and smol_vocab.eos_id == 2
    assert smol_vocab.is_special[:17].all() and not smol_vocab.is_special[17:].any()
    for text in TEXTS:
        ids = smol_tokenizer.encode(text, add_special_tokens=False)
        assert smol_vocab.decode_bytes(ids) == text.encode("utf-8")
    rng = np.random.default_rng(0)
    for _ in range(300):
        ids = rng.choice(smol_vocab.ordinary_ids, size=4).tolist()
        ref = smol_tokenizer.decode(ids, clean_up_tokenization_spaces=False)
        assert smol_vocab.decode_bytes(ids).decode("utf-8", errors="replace") == ref


def test_sentencepiece_byte_fallback(tmp_path, monkeypatch):
    from test_tokenizer_gguf import make_sentencepiece_gguf
    from jaxcd.tokenizer import load_tokenizer
    monkeypatch.setenv("JAXCD_CACHE", str(tmp_path / "cache"))
    tok = load_tokenizer(make_sentencepiece_gguf(tmp_path / "tiny-spm.gguf"))
    vocab = Vocabulary.from_tokenizer(tok)
    pieces = tok.convert_ids_to_tokens(list(range(len(tok))))
    assert vocab.token_bytes[pieces.index("<0x0A>")] == b"\n"
    assert vocab.token_bytes[pieces.index("▁hello")] == b" hello"
    for text in ["hello world", "日本 ü", "the foo = 12"]:
        ids = tok.encode(text, add_special_tokens=False)
        # SentencePiece adds a dummy-prefix space that decode() strips again
        assert vocab.decode_bytes(ids) in (text.encode(), b" " + text.encode())
        assert vocab.decode_bytes(ids).decode().lstrip(" ") == tok.decode(ids).lstrip(" ")


def test_vocabulary_errors():
    with pytest.raises(VocabularyError, match="outside"):
        Vocabulary.from_token_bytes([b"a", b"b"], eos_id=5)
    with pytest.raises(VocabularyError, match="empty"):
        Vocabulary.from_token_bytes([b"a", b""], eos_id=0)


def test_disk_cache_round_trip(tmp_path, smol_vocab):
    fa = compile_regex(r"[0-9]{2,3}-x", smol_vocab, cache=tmp_path)
    files = list(tmp_path.glob("*.npz"))
    assert len(files) == 1
    again = compile_regex(r"[0-9]{2,3}-x", smol_vocab, cache=tmp_path)
    for f in ("edge_src", "edge_dst", "out_start", "out_dst", "cum_masks", "dist"):
        np.testing.assert_array_equal(getattr(fa, f), getattr(again, f))
    assert (fa.num_states, fa.initial_state, fa.final_state) == \
           (again.num_states, again.initial_state, again.final_state)
    other = Vocabulary.from_token_bytes([b"1", b"2", b"-", b"x", b"0"] + [bytes([c]) for c in b"3456789"],
                                        eos_id=0)
    compile_regex(r"[0-9]{2,3}-x", other, cache=tmp_path)
    assert len(list(tmp_path.glob("*.npz"))) == 2      # keyed by the vocabulary too
