"""The ``specobs`` commands that read a server from outside, and the parts they share.

Each command is one private module, or a subpackage where it has several parts:

=============  ==================================  ============================================
command        module                              what it does
=============  ==================================  ============================================
``top``        :mod:`specobs.tools._top`           live cycle breakdown of a /metrics endpoint
                                                   or a Prometheus server
``doctor``     :mod:`specobs.tools._doctor`        one-shot health check of an endpoint
``advise``     :mod:`specobs.tools._advise`        a speculation length for each band of batch
                                                   sizes, in the engine's own configuration
``report``     :mod:`specobs.tools.report`         self-contained HTML report of a run, or A/B
``load``       :mod:`specobs.tools._load`          load generator for any OpenAI-style
                                                   ``/v1/completions`` endpoint
``generate``   :mod:`specobs.tools._generate`      dashboards, rules and docs from the catalog
``fleet-sim``  :mod:`specobs.tools.fleet`          simulated servers with injected faults, and
                                                   scoring alerts against them
``engines``    :mod:`specobs.tools._engines`       the installed engines against specobs's hook
                                                   tables
=============  ==================================  ============================================

``_top``, ``_doctor``, ``report`` and ``fleet`` are subpackages; the others are single modules.

Shared parts: :mod:`._client` (bounded GETs: one deadline, a body cap, the one httpx →
``ScrapeError`` mapping), :mod:`._scrape` (scrape, parse, difference two scrapes),
:mod:`._promapi` (the same deltas from Prometheus's ``increase()``), :mod:`._breakdown` (the one
cycle-breakdown definition, shared with the ``specobs demo`` summary and matching the recording
rules) and :mod:`._diagnosis` (the findings ``doctor``, ``top``, ``advise``, ``report`` and the
demo's summary print, a subpackage of its own).

Each command module has ``add_arguments(parser)`` and ``run(args) -> int``; :mod:`specobs.cli`
imports one only when its command runs. Importing this package imports nothing: httpx, rich,
prometheus_client and plotly are imported inside the functions that use them.
"""
