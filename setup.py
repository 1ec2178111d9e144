"""The one thing pyproject.toml cannot say: the optional compiled parts.

``specobs/_core.c`` (the native hot path, specified by ``specobs/_ring.py``) and
``specobs/_speedups.c`` (the resolver's bucketing, specified by ``specobs/_bucketing.py``) are
built when a C compiler and the Python headers are there; where a build fails, specobs installs
without it and uses the pure-Python version. Both include ``specobs/_bucket.h``, the bucketing
they share.
"""

from setuptools import Extension, setup

#: The header both extensions include (shipped in the sdist as their ``depends``).
_SHARED = ["specobs/_bucket.h"]

setup(
    ext_modules=[
        Extension("specobs._core", ["specobs/_core.c"], depends=_SHARED, optional=True),
        Extension("specobs._speedups", ["specobs/_speedups.c"], depends=_SHARED, optional=True),
    ]
)
