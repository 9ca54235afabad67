"""Old path of :mod:`jaxcd.decoding.sampling`, kept importable: this module is that one."""
import sys
from .decoding import sampling as _m
sys.modules[__name__] = _m
