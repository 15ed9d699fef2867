"""The one C extension: min, max and sum of squares of float32 gradients in one pass, with
their crc32c in it where the CPU can.

Everything else about the build is in pyproject.toml. core/store/_stats.py uses the
extension where it was built and NumPy where it was not; it is optional, so an install
with no C compiler, or one that cannot build it (MSVC: no GCC vector extensions), still
succeeds.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "gradvault.core.store._fused_stats",
            sources=["src/gradvault/core/store/_fused_stats.c"],
            extra_compile_args=["-O3"],
            optional=True,
        )
    ]
)
