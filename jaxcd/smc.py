"""Old path of :mod:`jaxcd.decoding.smc`, kept importable: this module is that one."""
import sys
from .decoding import smc as _m
sys.modules[__name__] = _m
