"""Instrumentors: specobs inside engines you do not change.

Each module patches one engine's speculative decoding loop so that it reports cycles to a
:class:`specobs.Observer`; each is loaded by the engine's own plugin mechanism, by
``opentelemetry-instrument``, or by hand, and imports nothing of its engine until the engine
imports it itself:

* :mod:`specobs.instrument.vllm` -- ``vllm.general_plugins`` entry point (``SPECOBS_VLLM=1``):
  the V1 and V2 GPU model runners;
* :mod:`specobs.instrument.sglang` -- ``sglang.srt.plugins`` entry point (``SPECOBS_SGLANG=1``):
  the speculative workers ``create_worker`` returns;
* :mod:`specobs.instrument.transformers` -- ``TransformersInstrumentor`` (also an
  ``opentelemetry_instrumentor`` entry point): assisted generation.

What each phase covers per engine and release, which process records and on which port:
``docs/integrations.md``. This package imports none of them: ``import specobs.instrument`` is
free.
"""
