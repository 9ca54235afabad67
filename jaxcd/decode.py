"""Old path of :mod:`jaxcd.decoding.decode`, kept importable: this module is that one."""
import sys
from .decoding import decode as _m
sys.modules[__name__] = _m
