"""The package the transformers instrumentor patches, named without importing it."""

from specobs.instrument._base import PackageRange

PACKAGE = PackageRange("transformers", minimum="4.57", below="6")
"""Hugging Face transformers; the assisted-generation seams are unchanged across this range."""
