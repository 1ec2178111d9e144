"""``specobs report``: one self-contained HTML file of a run, or an A/B comparison of two.

    specobs report --from http://127.0.0.1:9477/metrics --duration 60 -o run.html --save run.jsonl
    specobs report --from run.jsonl -o run.html
    specobs report --prometheus http://prometheus:9090 --selector '{job="specobs"}' --last 30m
    specobs report --compare healthy.jsonl faulty.jsonl -o ab.html
    specobs report --prometheus http://prometheus:9090 --compare '{instance="a:9477"}' \\
        '{instance="b:9477"}' --last 1h

The file opens with no network: plotly.js is inlined once and every chart is a plotly figure.
At the top, a one-screen summary table of the whole run with the definitions of ``specobs top``
and the recording rules (the numbers come from :func:`specobs.tools._breakdown.breakdown` and
:func:`specobs.tools._breakdown.speedups`, nothing is recomputed here), then the findings of
``specobs doctor``'s diagnosis on the whole run, the batch size above which speculation stops
paying over the batch sizes its windows served, and its last window against the run
(:func:`run_findings`, docs/diagnosis.md). Below: the cycle breakdown
over time on the GPU and host clocks (stacked per phase), phase shares and p50/p99, acceptance
over time and per draft position (from 0, as the engines count), the accept-length distribution
(accepted drafts 0..k), tokens/s per server and per sequence (with the non-speculative
baseline), realized and predicted speedup, drops and exporter health (each on its own axis).
A clock without samples, or any chart without a value, is one line of text, never an empty
chart (docs/report.md, "Charts").

``--compare A B`` puts two runs side by side, with their differences and a verdict per metric;
how a change is judged beyond the run-to-run noise is in :mod:`specobs.tools.report._stats`
and docs/report.md.

Sources are read by :mod:`specobs.tools.report._data`. Errors (an unreachable endpoint, an empty
range, a bad file) are one line on stderr and exit status 1; bad flags exit 2. Credentials in a
URL are sent as HTTP Basic authentication; the report, the ``--save`` file and every message
show the URL without them.
"""

from specobs.tools.report._command import REGRESSION_EXIT, add_arguments, run
from specobs.tools.report._page import compare_changes, render_compare, render_run

__all__ = ["REGRESSION_EXIT", "add_arguments", "compare_changes", "render_compare",
           "render_run", "run"]
