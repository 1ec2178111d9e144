"""The one thing pyproject.toml cannot say: the optional compiled parts.

``specobs._core`` (the native hot path, specified by ``specobs/_ring.py``) is built from the C
files of ``specobs/_core/``, one per concern, which share the internal header ``core.h``;
``specobs._speedups`` (the resolver's bucketing, specified by ``specobs/_bucketing.py``) from
``specobs/_speedups.c``. Each is built when a C compiler and the Python headers are there; where
a build fails, specobs installs without it and uses the pure-Python version. Both include
``specobs/_bucket.h``, the bucketing they share.
"""

from setuptools import Extension, setup

#: The header both extensions include (shipped in the sdist as their ``depends``).
_SHARED = ["specobs/_bucket.h"]

#: The native core's files, one per concern (docs/architecture.md, "The native core").
_CORE = [
    f"specobs/_core/{name}.c" for name in ("ring", "events", "copies", "drain", "pump", "module")
]

setup(
    ext_modules=[
        Extension(
            "specobs._core", _CORE, optional=True,
            depends=[*_SHARED, "specobs/_core/core.h", "specobs/_core/ring_accept_cuda.h"],
        ),
        Extension("specobs._speedups", ["specobs/_speedups.c"], depends=_SHARED, optional=True),
    ]
)
