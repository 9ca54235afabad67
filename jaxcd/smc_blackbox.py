"""Old path of :mod:`jaxcd.decoding.smc_blackbox`, kept importable: this module is that one."""
import sys
from .decoding import smc_blackbox as _m
sys.modules[__name__] = _m
