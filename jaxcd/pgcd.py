"""Old path of :mod:`jaxcd.decoding.pgcd`, kept importable: this module is that one."""
import sys
from .decoding import pgcd as _m
sys.modules[__name__] = _m
