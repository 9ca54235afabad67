"""Old path of :mod:`jaxcd.decoding.buckets`, kept importable: this module is that one."""
import sys
from .decoding import buckets as _m
sys.modules[__name__] = _m
