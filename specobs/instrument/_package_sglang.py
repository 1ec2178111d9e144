"""The package the SGLang plugin patches, named without importing it."""

from specobs.instrument._base import PackageRange

PACKAGE = PackageRange("sglang", minimum="0.5.5", below="0.6")
"""SGLang; the EAGLE worker seams (V1 up to 0.5.12, V2 throughout) hold across this range."""
