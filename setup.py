"""The one thing pyproject.toml cannot say: the optional compiled parts.

``specobs/_core.c`` (the native hot path, specified by ``specobs/_ring.py``) and
``specobs/_speedups.c`` (the resolver's bucketing, specified by ``specobs/_bucketing.py``) are
built when a C compiler and the Python headers are there; where a build fails, specobs installs
without it and uses the pure-Python version.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension("specobs._core", ["specobs/_core.c"], optional=True),
        Extension("specobs._speedups", ["specobs/_speedups.c"], optional=True),
    ]
)
