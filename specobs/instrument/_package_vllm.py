"""The package the vLLM plugin patches, named without importing it."""

from specobs.instrument._base import PackageRange

PACKAGE = PackageRange("vllm", minimum="0.11", below="0.34")
"""vLLM; the v1 GPU model runner seams hold across this range."""
