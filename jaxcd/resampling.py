"""Old path of :mod:`jaxcd.decoding.resampling`, kept importable: this module is that one."""
import sys
from .decoding import resampling as _m
sys.modules[__name__] = _m
