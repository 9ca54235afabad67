"""The tokenizer of a GGUF model, built without PyTorch.

A GGUF file carries no ``tokenizer.json``: the vocabulary, the BPE merges, the token
types and the special-token ids are stored as metadata under llama.cpp's key names
(``tokenizer.ggml.*``). ``transformers`` can rebuild a fast tokenizer from them
(``AutoTokenizer.from_pretrained(folder, gguf_file=name)``), but its GGUF reader
(``transformers.integrations.gguf.reader``, and ``modeling_gguf_pytorch_utils`` in
4.x) imports ``torch`` at module level: loading the tokenizer that way pulls PyTorch
into a JAX process (seconds of import time, hundreds of MB of memory, and a hard
dependency jaxcd otherwise does not have).

:func:`load_tokenizer` does the same job with the ``gguf`` package (``GGUFReader``,
numpy only) and ``tokenizers``. It replicates transformers' own conversion (5.x,
``integrations/gguf/gguf_tokenizer_mapping.py``) piece by piece -- model, normalizer,
pre-tokenizer, decoder, post-processor, added/special tokens -- so that the result is
token-for-token identical; ``tests/test_tokenizer_gguf.py`` checks that against
transformers itself. Supported ``tokenizer.ggml.model`` values:

* ``gpt2`` -- byte-level BPE (SmolLM2, Llama-3, Qwen, ...). The pre-tokenizer split
  regex follows ``tokenizer.ggml.pre`` for the names transformers knows; other names
  (``smollm``, ``gpt2``, ...) get GPT-2's ``ByteLevel`` regex, as in transformers.
* ``llama`` -- SentencePiece-style BPE with ``▁`` for spaces and ``<0xNN>`` byte
  fallback (Llama-2, Mistral, TinyLlama, ...; the Phi-3 normalizer variant too).
  Merges missing from the file are derived from the token scores, as transformers does.

* ``llama`` with ``general.architecture`` ``gemma``/``gemma2``/``gemma3`` -- Gemma's
  SentencePiece variant (spaces to ``▁`` by a normalizer, merges rebuilt in file order).

``t5`` (unigram) and ``gemma4`` are not supported and raise
:class:`~jaxcd.errors.VocabularyError`.

One deliberate difference: transformers' builder classes add their default special
tokens (``<|endoftext|>`` for byte-level BPE, ``<unk>``/``<s>``/``</s>`` for
SentencePiece) as *new* ids past the end of the vocabulary when a file lacks them;
we only mark them special when the vocabulary has them, so the tokenizer never has
ids the model has no logits for.

The first load of a file builds the tokenizer (a few seconds: the ``GGUFReader`` pass
dominates) and caches it in ``cache_dir()/tokenizers/<key>/`` (``tokenizer.json`` plus
``jaxcd_tokenizer.json`` with the special tokens and the chat template); the key
derives from the file's name, size and modification time. Later loads read only the
cache.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
import warnings
from functools import lru_cache
from pathlib import Path
from typing import Any

from .errors import ModelFileError, VocabularyError
from .model_files import cache_dir, resolve_gguf

__all__ = ["load_tokenizer", "read_gguf_tokenizer_metadata", "build_backend_tokenizer",
           "tokenizer_cache_path"]

#: Bump when the built tokenizer could change, so stale caches are not reused.
CACHE_FORMAT = 1   # Gemma files were refused before, so no stale cache can hold one
_TOKENIZER_FILE = "tokenizer.json"
_META_FILE = "jaxcd_tokenizer.json"

# llama.cpp token types (tokenizer.ggml.token_type)
_CONTROL = 3
_USER_DEFINED = 4

# The GGUF keys read, and the names transformers gives them.
_TOKENIZER_KEYS = {
    "tokenizer.ggml.model": "tokenizer_type",
    "tokenizer.ggml.pre": "pre_tokenizer_type",
    "tokenizer.ggml.tokens": "tokens",
    "tokenizer.ggml.scores": "scores",
    "tokenizer.ggml.token_type": "token_type",
    "tokenizer.ggml.merges": "merges",
    "tokenizer.ggml.bos_token_id": "bos_token_id",
    "tokenizer.ggml.eos_token_id": "eos_token_id",
    "tokenizer.ggml.unknown_token_id": "unk_token_id",
    "tokenizer.ggml.padding_token_id": "pad_token_id",
    "tokenizer.ggml.add_bos_token": "add_bos_token",
    "tokenizer.ggml.add_eos_token": "add_eos_token",
    "tokenizer.chat_template": "chat_template",
    "general.architecture": "architecture",
}

_SPECIAL_IDS = {
    "bos_token": "bos_token_id",
    "eos_token": "eos_token_id",
    "unk_token": "unk_token_id",
    "pad_token": "pad_token_id",
}

# Pre-tokenizer split regexes by ``tokenizer.ggml.pre`` (copied from transformers 5.x).
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_TEKKEN_SPLIT = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_GPT4O_SPLIT = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN35_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
    r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
PRE_TOKENIZER_SPLITS = {
    **dict.fromkeys(["llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral",
                     "midm-2.0", "lfm2", "jina-v5-nano", "dbrx", "smaug-bpe"], _LLAMA3_SPLIT),
    "tekken": _TEKKEN_SPLIT,
    **dict.fromkeys(["qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "megrez"], _QWEN2_SPLIT),
    "qwen35": _QWEN35_SPLIT,
    **dict.fromkeys(["gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2"], _GPT4O_SPLIT),
}

SUPPORTED_TOKENIZER_MODELS = ("gpt2", "llama")
_SUPPORTED_DOC = "'gpt2' (byte-level BPE) and 'llama' (SentencePiece BPE; not Gemma's variant)"


# ----------------------------------------------------------------------------- reading


def read_gguf_tokenizer_metadata(gguf_path: str | os.PathLike) -> dict[str, Any]:
    """The tokenizer metadata of a GGUF file, under transformers' names
    (``tokens``, ``merges``, ``token_type``, ``scores``, ``bos_token_id``, ...,
    ``chat_template``, ``architecture``). Keys the file lacks are absent.

    Raises :class:`ModelFileError` when the file cannot be parsed as GGUF.
    """
    path = Path(gguf_path)
    try:
        from .lm.gguf_weights import _reader_class
    except ImportError as exc:  # pragma: no cover - gguf is a dependency
        raise ModelFileError(f"reading {path} needs the 'gguf' package: {exc}") from exc
    if not path.is_file():
        raise ModelFileError(f"model file not found: {path}")
    try:
        reader = _reader_class()(str(path), "r")
    except Exception as exc:  # truncated or garbled header: struct/numpy/ValueError
        raise ModelFileError(
            f"{path} is not a readable GGUF file (corrupt or truncated metadata): "
            f"{type(exc).__name__}: {exc}") from exc
    out: dict[str, Any] = {}
    try:
        for key, name in _TOKENIZER_KEYS.items():
            field = reader.fields.get(key)
            if field is not None:
                out[name] = _field_value(field)
    except UnicodeDecodeError as exc:
        raise ModelFileError(f"{path}: metadata string is not valid UTF-8 ({exc})") from exc
    except Exception as exc:
        raise ModelFileError(
            f"{path}: could not read the tokenizer metadata: {type(exc).__name__}: {exc}") from exc
    finally:
        del reader  # drops the memory map
    return out


def _field_value(field) -> Any:
    """A ``gguf.ReaderField``'s value as plain Python (str, int, float, bool, list)."""
    from gguf import GGUFValueType

    types = list(field.types)
    if not types:
        return None
    if types[0] == GGUFValueType.ARRAY:
        if len(types) > 1 and types[1] == GGUFValueType.STRING:
            return [bytes(field.parts[i]).decode("utf-8") for i in field.data]
        if len(types) > 1 and types[1] == GGUFValueType.ARRAY:
            raise ValueError(f"nested arrays are not supported (key {field.name})")
        return [field.parts[i].tolist()[0] for i in field.data]
    if types[0] == GGUFValueType.STRING:
        return bytes(field.parts[field.data[0]]).decode("utf-8")
    return field.parts[field.data[0]].tolist()[0]


# ----------------------------------------------------------------------------- building


@lru_cache(maxsize=1)
def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable-character table."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs)))


def _generate_merges(vocab: dict[str, int], vocab_scores: dict[str, float] | None):
    """BPE merges implied by a vocabulary (transformers' ``generate_merges``): every split
    of a token into two tokens, ordered by the token's score (best first)."""
    reverse = vocab_scores is not None
    vocab_scores = dict(vocab_scores) if reverse else vocab
    merges = []
    for merge, piece_score in vocab_scores.items():
        local = []
        for index in range(1, len(merge)):
            piece_l, piece_r = merge[:index], merge[index:]
            if piece_l in vocab and piece_r in vocab:
                local.append((piece_l, piece_r, piece_score))
        local.sort(key=lambda x: (vocab[x[0]], vocab[x[1]]))
        merges.extend(local)
    merges.sort(key=lambda val: (val[2], len(val[0]), len(val[1])), reverse=reverse)
    return [(val[0], val[1]) for val in merges]


def _get_merges(meta: dict, vocab_scores: dict | None = None, where: str = "") -> list:
    if "merges" in meta:
        merges = [tuple(m.split(" ")) for m in meta["merges"]]
        bad = next((m for m in merges if len(m) != 2), None)
        if bad is not None:
            raise VocabularyError(f"{where}: malformed merge {' '.join(bad)!r} in tokenizer.ggml.merges")
        return merges
    tokens = meta["tokens"]
    if vocab_scores is None:
        if "scores" not in meta:
            raise VocabularyError(
                f"{where}: the file has neither tokenizer.ggml.merges nor tokenizer.ggml.scores, "
                "so its BPE merges cannot be derived")
        vocab_scores = dict(zip(tokens, meta["scores"]))
    return _generate_merges({t: i for i, t in enumerate(tokens)}, vocab_scores)


def _byte_level_backend(meta: dict, where: str):
    from tokenizers import Tokenizer, decoders, pre_tokenizers
    from tokenizers.models import BPE

    spelling = _bytes_to_unicode()
    alphabet = set(spelling.values())
    vocab = {
        token if set(token) <= alphabet else "".join(spelling[b] for b in token.encode("utf-8")): index
        for index, token in enumerate(meta["tokens"])
    }
    tok = Tokenizer(BPE(vocab=vocab, merges=_get_merges(meta, where=where), dropout=None,
                        continuing_subword_prefix="", end_of_word_suffix="", fuse_unk=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return tok, ["<|endoftext|>"]  # GPT2Tokenizer's default unk/bos/eos


def _sentencepiece_backend(meta: dict, where: str, phi3: bool = False):
    from tokenizers import Tokenizer, decoders, normalizers, pre_tokenizers
    from tokenizers.models import BPE

    vocab = {token: index for index, token in enumerate(meta["tokens"])}
    tok = Tokenizer(BPE(vocab=vocab, merges=_get_merges(meta, where=where), fuse_unk=True,
                        byte_fallback=True, dropout=None))
    # LlamaTokenizer(add_prefix_space=None -> True, legacy=False): prepend "▁" to the first word
    tok.normalizer = None
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first",
                                                 split=False)
    tok.decoder = decoders.Sequence([
        decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
        decoders.Strip(content=" ", left=1),
    ])
    if phi3:  # the prefix space comes from a normalizer instead of Metaspace
        tok.normalizer = normalizers.Sequence(
            [normalizers.Prepend(prepend="\u2581"), normalizers.Replace(pattern=" ", content="\u2581")])
        tok.pre_tokenizer = None
    return tok, ["<s>", "</s>", "<unk>"]  # LlamaTokenizer's default bos/eos/unk


def _gemma_backend(meta: dict, where: str):
    """Gemma's SentencePiece BPE, as transformers' ``gemma_tokenizer`` (GGUF conversion)
    and ``GemmaTokenizer`` build it: tokens made only of spaces are respelled with ``▁``,
    merges are rebuilt from the vocabulary in file order (Gemma files carry no merges
    and their scores do not follow the merge order), spaces become ``▁`` in a normalizer
    (no prefix space), byte fallback."""
    from tokenizers import Tokenizer, decoders, normalizers, pre_tokenizers
    from tokenizers.models import BPE

    tokens = ["\u2581" * len(t) if " " in t and not t.strip() else t for t in meta["tokens"]]
    vocab = {t: i for i, t in enumerate(tokens)}
    positions = {t: -i for i, t in enumerate(tokens)}
    merges = _get_merges(dict(meta, tokens=tokens), vocab_scores=positions, where=where) \
        if "merges" not in meta else _get_merges(meta, where=where)
    unk = tokens[meta["unk_token_id"]] if meta.get("unk_token_id") is not None else "<unk>"
    tok = Tokenizer(BPE(vocab=vocab, merges=merges, fuse_unk=True, unk_token=unk, dropout=None,
                        byte_fallback=True))
    tok.pre_tokenizer = pre_tokenizers.Split(pattern=" ", behavior="merged_with_previous",
                                             invert=False)
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(),
                                     decoders.Fuse()])
    tok.normalizer = normalizers.Replace(" ", "\u2581")
    return tok, ["<unk>", "<bos>", "<eos>", "<pad>", "<mask>"]  # GemmaTokenizer's defaults


_GEMMA_ARCHS = ("gemma", "gemma2", "gemma3")
_UNSUPPORTED_SENTENCEPIECE_ARCHS = ()


def build_backend_tokenizer(meta: dict, where: str = "GGUF file"):
    """``(tokenizers.Tokenizer, init_kwargs)`` from :func:`read_gguf_tokenizer_metadata`'s
    output, as transformers' GGUF conversion builds them. ``init_kwargs`` are the keyword
    arguments for ``PreTrainedTokenizerFast`` (special tokens, chat template, BOS/EOS flags).
    """
    from tokenizers import AddedToken, Regex, pre_tokenizers

    model = meta.get("tokenizer_type")
    arch = meta.get("architecture")
    if model is None:
        raise VocabularyError(f"{where} has no tokenizer.ggml.model key: it carries no tokenizer")
    tokens = meta.get("tokens")
    if not tokens:
        raise VocabularyError(f"{where} has no tokenizer.ggml.tokens (empty vocabulary)")
    token_type = meta.get("token_type") or []
    if token_type and len(token_type) != len(tokens):
        raise VocabularyError(
            f"{where}: tokenizer.ggml.token_type has {len(token_type)} entries for "
            f"{len(tokens)} tokens")
    for key in _SPECIAL_IDS.values():
        index = meta.get(key)
        if index is not None and not 0 <= index < len(tokens):
            gguf_key = {"unk_token_id": "unknown_token_id", "pad_token_id": "padding_token_id"}.get(key, key)
            raise VocabularyError(
                f"{where}: tokenizer.ggml.{gguf_key} = {index} is outside the vocabulary "
                f"(size {len(tokens)})")
    if model == "gpt2":
        tok, defaults = _byte_level_backend(meta, where)
    elif model == "llama" and arch in _GEMMA_ARCHS:
        tok, defaults = _gemma_backend(meta, where)
    elif model == "llama" and arch not in _UNSUPPORTED_SENTENCEPIECE_ARCHS:
        tok, defaults = _sentencepiece_backend(meta, where, phi3=(arch == "phi3"))
    else:
        what = f"{model!r}" + (f" for architecture {arch!r}" if model == "llama" else "")
        raise VocabularyError(
            f"{where}: unsupported GGUF tokenizer model {what} (tokenizer.ggml.model); "
            f"jaxcd builds {_SUPPORTED_DOC}")

    # 1. the builder class's own default special tokens (only those the vocabulary has)
    model_vocab = tok.get_vocab(with_added_tokens=False)
    tok.add_tokens([AddedToken(t, special=True) for t in defaults if t in model_vocab])
    # 2. CONTROL tokens become special; in a byte-level vocabulary one spelled outside the
    #    byte alphabet is a llama.cpp mislabel and is skipped (as in transformers)
    spelled = set(_bytes_to_unicode().values()) if model == "gpt2" else None
    control = [AddedToken(t, normalized=False, special=True)
               for t, ty in zip(tokens, token_type)
               if ty == _CONTROL and (spelled is None or set(t) <= spelled)]
    if control:
        tok.add_special_tokens(control)
    # 3. USER_DEFINED tokens are matched whole, but are not special
    vocab = tok.get_vocab()
    user = [AddedToken(t, normalized=False, special=False)
            for t, ty in zip(tokens, token_type) if ty == _USER_DEFINED and t in vocab]
    if user:
        tok.add_tokens(user)
    # 4. the split regex that goes with tokenizer.ggml.pre
    split = PRE_TOKENIZER_SPLITS.get(meta.get("pre_tokenizer_type"))
    if split is not None:
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(split), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])

    kwargs: dict[str, Any] = {}
    if "chat_template" in meta:
        kwargs["chat_template"] = meta["chat_template"]
    for flag in ("add_bos_token", "add_eos_token"):
        if flag in meta:
            kwargs[flag] = bool(meta[flag])
    if model == "llama":
        # older files have no flag; llama.cpp adds BOS to a sentencepiece vocabulary
        kwargs.setdefault("add_bos_token", True)
    for name, key in _SPECIAL_IDS.items():
        index = meta.get(key)
        kwargs[name] = tokens[index] if index is not None else None
    return tok, kwargs



# ----------------------------------------------------------------------------- caching


def tokenizer_cache_path(gguf_path: str | os.PathLike) -> Path:
    """The cache folder for a GGUF file's tokenizer: ``cache_dir()/tokenizers/<key>``,
    the key from the file's name, size and modification time (and the cache format)."""
    path = Path(gguf_path)
    st = path.stat()
    digest = hashlib.sha256(
        f"{path.name}\0{st.st_size}\0{st.st_mtime_ns}\0v{CACHE_FORMAT}".encode()).hexdigest()[:16]
    stem = re.sub(r"[^A-Za-z0-9._-]+", "_", path.stem)[:80] or "gguf"
    return cache_dir() / "tokenizers" / f"{stem}-{digest}"


def _atomic_write(target: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, 0o644)  # mkstemp makes it 0600
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _write_cache(folder: Path, backend_json: str, kwargs: dict, source: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    _atomic_write(folder / _TOKENIZER_FILE, backend_json)
    meta = {"format": CACHE_FORMAT, "source": source.name, "init_kwargs": kwargs}
    # written last: its presence means the folder is complete
    _atomic_write(folder / _META_FILE, json.dumps(meta, ensure_ascii=False, indent=1))


def _read_cache(folder: Path) -> tuple[Path, dict] | None:
    meta_file, tok_file = folder / _META_FILE, folder / _TOKENIZER_FILE
    if not (meta_file.is_file() and tok_file.is_file()):
        return None
    try:
        meta = json.loads(meta_file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(meta, dict) or meta.get("format") != CACHE_FORMAT \
            or not isinstance(meta.get("init_kwargs"), dict):
        return None
    return tok_file, meta["init_kwargs"]


# ----------------------------------------------------------------------------- public


def _wrap(kwargs: dict, gguf: Path, *, tokenizer_object=None, tokenizer_file=None):
    from transformers import PreTrainedTokenizerFast

    # name_or_path + is_local + local_files_only: as transformers' own GGUF load, and keeps
    # transformers from asking the Hub about the model (it does for vocabularies > 100k).
    extra = dict(name_or_path=str(gguf.parent), is_local=True, local_files_only=True)
    if tokenizer_object is not None:
        return PreTrainedTokenizerFast(tokenizer_object=tokenizer_object, **extra, **kwargs)
    return PreTrainedTokenizerFast(tokenizer_file=str(tokenizer_file), **extra, **kwargs)


def load_tokenizer(gguf_path: str | os.PathLike | None = None, *, use_cache: bool = True):
    """The fast tokenizer (``transformers.PreTrainedTokenizerFast``) described by a GGUF
    file's metadata, built without importing PyTorch.

    ``gguf_path=None`` means the default model (SmolLM2-135M-Instruct). The first load of a
    file builds the tokenizer and writes it to :func:`tokenizer_cache_path`; later loads
    read that cache only. ``use_cache=False`` neither reads nor writes it.

    Raises :class:`ModelFileError` if the file is missing, not GGUF or corrupt, and
    :class:`VocabularyError` if it describes no tokenizer or one jaxcd does not support.
    """
    if gguf_path is not None and Path(gguf_path).is_dir():     # a Hugging Face folder
        from .lm.hf_checkpoint import load_hf_tokenizer

        return load_hf_tokenizer(gguf_path)
    path = resolve_gguf(gguf_path)
    folder = None
    if use_cache:
        try:
            folder = tokenizer_cache_path(path)
        except OSError as exc:
            raise ModelFileError(f"cannot stat model file {path}: {exc}") from exc
        cached = _read_cache(folder)
        if cached is not None:
            tok_file, kwargs = cached
            try:
                return _wrap(kwargs, path, tokenizer_file=tok_file)
            except Exception as exc:  # a damaged cache: rebuild it
                warnings.warn(f"jaxcd: ignoring unreadable tokenizer cache {folder}: {exc}",
                              stacklevel=2)

    meta = read_gguf_tokenizer_metadata(path)
    try:
        backend, kwargs = build_backend_tokenizer(meta, where=str(path))
    except VocabularyError:
        raise
    except Exception as exc:  # e.g. tokenizers rejecting a merge of unknown tokens
        raise VocabularyError(
            f"{path}: the tokenizer metadata does not form a valid tokenizer: "
            f"{type(exc).__name__}: {exc}") from exc
    tokenizer = _wrap(kwargs, path, tokenizer_object=backend)
    if folder is not None:
        try:
            _write_cache(folder, tokenizer.backend_tokenizer.to_str(), kwargs, path)
        except OSError as exc:
            warnings.warn(f"jaxcd: could not write the tokenizer cache {folder}: {exc}",
                          stacklevel=2)
    return tokenizer
