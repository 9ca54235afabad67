"""Old path of :mod:`jaxcd.decoding.gcd`, kept importable: this module is that one."""
import sys
from .decoding import gcd as _m
sys.modules[__name__] = _m
