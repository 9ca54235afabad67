"""Memory estimates and checks for model weights and KV caches.

:func:`estimate_memory` counts the weights (``num_params`` x dtype size) and a KV cache;
:func:`check_memory` refuses with the figures when a need exceeds the available memory
(device memory on GPU/TPU; ``MemAvailable`` on CPU). ``JAXCD_MEMORY_LIMIT_GB`` (read
when a model or a cache is allocated, never while tracing) overrides the available figure.
"""

from __future__ import annotations

import os

from ..errors import ModelFileError

GiB = float(1 << 30)


def _itemsize(dtype) -> int:
    import jax.numpy as jnp

    return jnp.dtype(dtype).itemsize


def estimate_memory(cfg, dtype, batch: int = 0, max_len: int = 0) -> dict[str, int]:
    """Bytes of the weights and of a KV cache of ``batch`` rows x ``max_len`` slots."""
    size = _itemsize(dtype)
    kv = 2 * batch * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * max_len * size
    return {"weights": int(cfg.num_params) * size, "kv_cache": int(kv)}


def memory_limit() -> int | None:
    """``JAXCD_MEMORY_LIMIT_GB`` in bytes (``None`` when unset): a process-level setting,
    read when a model or cache is allocated on the host side, never while tracing."""
    env = os.environ.get("JAXCD_MEMORY_LIMIT_GB", "").strip()
    if not env:
        return None
    try:
        return int(float(env) * GiB)
    except ValueError:
        raise ValueError(f"JAXCD_MEMORY_LIMIT_GB={env!r}: expected a number of GiB") from None


def available_memory(device=None) -> tuple[int | None, str]:
    """``(bytes, where)`` the process may still allocate on ``device`` (default: the
    first device); ``None`` when unknown. :func:`memory_limit` overrides."""
    limit = memory_limit()
    if limit is not None:
        return limit, "JAXCD_MEMORY_LIMIT_GB"
    import jax

    device = device or jax.devices()[0]
    if device.platform != "cpu":
        try:
            st = device.memory_stats() or {}
            if "bytes_limit" in st:
                return int(st["bytes_limit"] - st.get("bytes_in_use", 0)), f"{device} memory"
        except Exception:
            pass
        return None, str(device)
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024, "host memory (MemAvailable)"
    except OSError:
        pass
    return None, "host memory"


def check_memory(what: str, need: int, device=None, shards: int = 1) -> None:
    """Raise :class:`ModelFileError` when ``need`` bytes (split over ``shards``
    devices) will not fit in :func:`available_memory`."""
    have, where = available_memory(device)
    per = need / max(shards, 1)
    if have is not None and per > have:
        split = f" ({need / GiB:.2f} GiB over {shards} devices)" if shards > 1 else ""
        raise ModelFileError(f"{what} needs {per / GiB:.2f} GiB{split}, but only "
                             f"{have / GiB:.2f} GiB of {where} is available")
