"""Experiments and benchmarks (run as ``python -m experiments.NAME`` or ``python experiments/NAME.py``)."""
