"""Old path of :mod:`jaxcd.decoding.awrs`, kept importable: this module is that one."""
import sys
from .decoding import awrs as _m
sys.modules[__name__] = _m
