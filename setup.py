"""The one thing pyproject.toml cannot say: the optional compiled speedups.

``specobs/_speedups.c`` is built when a C compiler and the Python headers are there; where the
build fails, specobs installs without it and uses the pure-Python reference
(``specobs/_bucketing.py``).
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("specobs._speedups", ["specobs/_speedups.c"], optional=True)])
