"""Old path of :mod:`jaxcd.decoding.compile_stats`, kept importable: this module is that one."""
import sys
from .decoding import compile_stats as _m
sys.modules[__name__] = _m
