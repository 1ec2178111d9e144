"""What specobs supports in each engine now: the declared hook tables (``_package_*.py``) with
the SGLang instrumentor's own list of the workers it does not time folded in.

``specobs engines`` and the generated support table in docs/integrations.md read this; the
instrumentors check only their contract (:mod:`specobs.instrument._contract`). Importing it
imports the SGLang instrumentor module, never an engine.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from specobs.instrument import _base, _contract, _package_sglang
from specobs.instrument import sglang as _sglang

__all__ = ["CONTRACTS", "report", "reports", "unsupported"]

CONTRACTS: tuple[_contract.Contract, ...] = tuple(_base.CONTRACTS.values())
"""vLLM, SGLang, transformers (the instrumentors' own tables): the order every report and table
lists them in."""


def unsupported(contract: _contract.Contract) -> dict[str, str]:
    """Methods or workers of ``contract`` specobs does not time, with the reason, as its
    instrumentor states them now (SGLang: ``UNSUPPORTED_WORKERS``, read at every call)."""
    if contract.package.distribution == _package_sglang.PACKAGE.distribution:
        return dict(_sglang.UNSUPPORTED_WORKERS)
    return {}


def report(contract: _contract.Contract,
           path: Sequence[str | Path] | None = None) -> _contract.EngineReport:
    """The verdict on ``contract``'s engine installed here (or under ``path``)."""
    return _contract.check(contract, path, unsupported=unsupported(contract))


def reports(path: Sequence[str | Path] | None = None) -> list[_contract.EngineReport]:
    """One report per engine, in :data:`CONTRACTS` order."""
    return [report(contract, path) for contract in CONTRACTS]
