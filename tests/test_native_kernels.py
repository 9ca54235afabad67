"""Every native kernel builds and registers wherever a C++ compiler is present.

jaxcd falls back to XLA (with a warning) when a kernel cannot be built, which is right
for users and wrong for the suite: a kernel whose source no longer compiles would
otherwise only turn its tests into skips. Here a build failure fails, with the
compiler's message."""

import pytest

from jaxcd.decoding import kernels as pgcd_kernels
from jaxcd.lm import kernels as lm_kernels

from native import skip_reason

pytestmark = pytest.mark.skipif(skip_reason() is not None, reason=str(skip_reason()))

KERNELS = {
    "layer_matmul": lm_kernels._KERNEL,
    "rows_matmul": lm_kernels._ROWS,
    "decode_attention": lm_kernels._ATTN,
    "pgcd_scores": pgcd_kernels._KERNEL,
}


@pytest.mark.parametrize("name", sorted(KERNELS))
def test_kernel_builds_and_registers(name):
    k = KERNELS[name]
    assert k.available(required=True, warn=False), k.error      # raises with the reason
    assert k.lib is not None and k.error is None


def test_pgcd_kernel_extra_handlers_register():
    """The P-GCD library's other handlers (edge index, indexed scores) are exported."""
    assert pgcd_kernels.pgcd_kernel_available(required=True)
    for symbol in pgcd_kernels._MORE.values():
        assert hasattr(pgcd_kernels._KERNEL.lib, symbol), symbol
