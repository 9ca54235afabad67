r"""Several processes: JAX's own multi-process runtime (``jax.distributed``).

``hmm-distill sample|train ... --coordinator HOST:PORT --num-processes N --process-id I``
calls :func:`initialize` before anything else touches JAX. Every process then sees
the devices of all processes in ``jax.devices()``; the EM mesh spans all of them and
the expected counts are summed across every process's devices by the same
``lax.psum`` that sums them across local devices (gloo collectives on CPU, NCCL on
GPU, ICI/DCN on TPU — chosen by JAX, not by us).

* Training: every process computes the same global batch order; each process puts
  only *its* rows of every global batch on its devices
  (``jax.make_array_from_process_local_data``); parameters are replicated, so every
  process holds the same parameters after each M-step. Process 0 alone writes the
  checkpoints, ``metrics.jsonl`` and the plot. Resume: process 0's latest
  checkpoint epoch is broadcast and every process loads it.
* Sampling: no collectives are needed (sequence ``i`` draws with its own key):
  process ``I`` samples the shards ``k ≡ I (mod N)``; after a barrier process 0
  writes the final ``metadata.json``.

On CPU the collectives are gloo: ``jax_cpu_collectives_implementation`` must be set
before ``jax.distributed.initialize`` (done here).
"""

from __future__ import annotations

import os

import jax
import numpy as np

from .errors import ConfigError

_INITIALISED = False


def initialize(coordinator: str | None, num_processes: int | None, process_id: int | None, *,
               local_device_ids=None) -> None:
    """Start JAX's multi-process runtime (no-op when ``coordinator`` is None).

    ``coordinator`` is ``HOST:PORT`` of process 0's coordination service. On clusters
    where JAX can detect these itself (SLURM, TPU pods, ...), pass
    ``coordinator="auto"`` to let ``jax.distributed.initialize()`` find them.
    """
    global _INITIALISED
    if coordinator is None:
        if num_processes not in (None, 1) or process_id not in (None, 0):
            raise ConfigError("--num-processes/--process-id need --coordinator HOST:PORT")
        return
    if _INITIALISED:
        return
    plat = os.environ.get("JAX_PLATFORMS", "")
    if plat in ("", "cpu") or "cpu" in plat.split(","):
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    if coordinator == "auto":
        jax.distributed.initialize()
    else:
        if ":" not in coordinator:
            raise ConfigError(f"--coordinator must be HOST:PORT, got {coordinator!r}")
        if num_processes is None or process_id is None:
            raise ConfigError("--coordinator needs --num-processes and --process-id")
        if not 0 <= process_id < num_processes:
            raise ConfigError(f"--process-id {process_id} outside [0, {num_processes})")
        jax.distributed.initialize(coordinator_address=coordinator, num_processes=num_processes,
                                   process_id=process_id, local_device_ids=local_device_ids)
    _INITIALISED = True


def process_index() -> int:
    return jax.process_index()


def process_count() -> int:
    return jax.process_count()


def is_main() -> bool:
    return jax.process_index() == 0


def barrier(name: str) -> None:
    """Wait for every process (no-op with one process)."""
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)


def broadcast_int(x: int) -> int:
    """Process 0's value of ``x`` on every process."""
    if jax.process_count() == 1:
        return int(x)
    from jax.experimental import multihost_utils

    return int(multihost_utils.broadcast_one_to_all(np.int64(x)))


def to_host(x) -> np.ndarray:
    """A replicated (or single-process) array as numpy, also when it spans devices of
    other processes."""
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
        if x.is_fully_replicated:
            return np.asarray(x.addressable_shards[0].data)
        from jax.experimental import multihost_utils

        return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return np.asarray(x)
