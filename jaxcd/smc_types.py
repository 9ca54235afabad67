"""Old path of :mod:`jaxcd.decoding.smc_types`, kept importable: this module is that one."""
import sys
from .decoding import smc_types as _m
sys.modules[__name__] = _m
