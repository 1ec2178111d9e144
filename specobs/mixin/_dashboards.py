"""Grafana dashboards as code (grafanalib is imported here and nowhere else).

Two dashboards, both with the variables ``datasource``, ``job``, ``instance`` (multi) and
``model``, fixed uids and grid positions:

* **cycle breakdown** — one server (or a few) in depth, from the raw series with
  ``$__rate_interval``: where a cycle's time goes on the GPU and host clocks, latency quantiles and
  heatmaps with exemplars, acceptance, throughput, speedup, and the exporter's own health;
* **fleet** — every server at once, from the ``instance:`` recording rules only, so it stays fast
  for a thousand servers.
"""

from __future__ import annotations

import json
import urllib.parse
from dataclasses import dataclass
from typing import Any

from grafanalib import core as g
from grafanalib._gen import DashboardEncoder

from specobs import catalog as c
from specobs.mixin._config import MixinConfig
from specobs.mixin._rules import BASELINE_CONFIGURED, RuleNames

__all__ = ["render_cycle_breakdown", "render_fleet"]

DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
#: The dashboard schema Grafana 11 writes; Grafana migrates older files on every load.
SCHEMA_VERSION = 39
NO_TRAFFIC = "No traffic"
#: What a GPU-clock-only panel shows on a busy server with no GPU-timed cycle (a CPU engine, or
#: no sampled cycle in the window): not "No traffic", which would be wrong there.
NO_GPU_CLOCK = "No GPU-timed cycles"
#: A ratio of two zero rates (an idle server) reads "No traffic", not NaN.
_NAN_MAPPING = [
    {"type": "special", "options": {"match": "nan", "result": {"text": NO_TRAFFIC, "index": 0}}}
]
#: grafanalib output that is not in Grafana's dashboard schema (legacy rows, Angular heatmaps).
_LEGACY_DASHBOARD_KEYS = frozenset(
    {"__inputs", "rows", "sharedCrosshair", "hideControls", "gnetId", "style"}
)
_LEGACY_PANEL_KEYS = frozenset(
    {
        "editable",
        "error",
        "hideTimeOverride",
        "transparent",
        "span",
        "minSpan",
        "height",
        "cards",
        "color",
        "heatmap",
        "xAxis",
        "yAxis",
        "dataFormat",
        "yBucketBound",
        "hideZeroBuckets",
        "highlightCards",
        "legend",
        "reverseYBuckets",
        "tooltip",
        "xBucketSize",
        "xBucketNumber",
        "yBucketSize",
        "yBucketNumber",
        "timeFrom",
        "timeShift",
        "maxPerRow",
        "repeat",
        "repeatDirection",
        "cacheTimeout",
        "maxDataPoints",
        "interval",
        "scopedVars",
        "columns",
        "fontSize",
        "mappings",
    }
)
_ROW_KEYS = frozenset({"collapsed", "gridPos", "id", "panels", "title", "type"})


def _strip_nulls(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_strip_nulls(v) for v in value]
    return value


def _clean_panel(panel: dict[str, Any]) -> dict[str, Any]:
    if panel.get("type") == "row":
        return {k: v for k, v in panel.items() if k in _ROW_KEYS}
    panel = {k: v for k, v in panel.items() if k not in _LEGACY_PANEL_KEYS}
    defaults = panel.get("fieldConfig", {}).get("defaults", {})
    thresholds = defaults.get("thresholds")
    if thresholds is not None and not (
        isinstance(thresholds.get("steps"), list) and thresholds["steps"]
    ):
        thresholds["steps"] = [{"color": "green", "value": None}]
    return panel


def _clean(data: dict[str, Any]) -> dict[str, Any]:
    """grafanalib's dashboard JSON made valid for Grafana's current schema: legacy keys gone,
    nulls dropped (optional fields are absent, not null), thresholds a list of steps."""
    data = {k: v for k, v in data.items() if k not in _LEGACY_DASHBOARD_KEYS}
    data["panels"] = [_clean_panel(p) for p in data["panels"]]
    for variable in data["templating"]["list"]:
        for key in ("useTags", "tagsQuery", "tagValuesQuery"):
            variable.pop(key, None)
        if isinstance(variable.get("current"), dict):
            variable["current"].pop("tags", None)
    data["schemaVersion"] = SCHEMA_VERSION
    data = _strip_nulls(data)
    # The base threshold step has no value by the schema's own definition: -Infinity is null.
    for panel in data["panels"]:
        steps = panel.get("fieldConfig", {}).get("defaults", {}).get("thresholds", {}).get("steps")
        if steps:
            steps[0]["value"] = None
    return data


RATE = "$__rate_interval"
WIDTH = 24
GPU = 'clock="gpu"'
HOST = 'clock="host"'


def _target(
    expr: str, legend: str, ref_id: str, *, exemplar: bool, instant: bool, fmt: str
) -> dict[str, Any]:
    """A Prometheus target bound to the ``$datasource`` variable."""
    return {
        "datasource": DATASOURCE,
        "editorMode": "code",
        "exemplar": exemplar,
        "expr": expr,
        "format": fmt,
        "instant": instant,
        "interval": "",
        "legendFormat": legend,
        "range": not instant,
        "refId": ref_id,
    }


@dataclass
class _Layout:
    """Places panels left to right, wrapping at 24 columns; assigns ids in order."""

    x: int = 0
    y: int = 0
    row_height: int = 0
    next_id: int = 1

    def place(self, w: int, h: int) -> tuple[int, g.GridPos]:
        if self.x + w > WIDTH:
            self.newline()
        pos = g.GridPos(h=h, w=w, x=self.x, y=self.y)
        self.x += w
        self.row_height = max(self.row_height, h)
        panel_id, self.next_id = self.next_id, self.next_id + 1
        return panel_id, pos

    def newline(self) -> None:
        if self.x:
            self.y += self.row_height
        self.x, self.row_height = 0, 0


class _Builder:
    def __init__(self, config: MixinConfig) -> None:
        self.config = config
        self.layout = _Layout()
        self.panels: list[g.Panel] = []

    def row(self, title: str) -> None:
        self.layout.newline()
        panel_id, pos = self.layout.place(WIDTH, 1)
        self.layout.newline()
        self.panels.append(g.RowPanel(title=title, id=panel_id, gridPos=pos, collapsed=False))

    def _links(self, exemplars: bool) -> list[dict[str, Any]]:
        uid = self.config.trace_datasource_uid
        if not exemplars or uid is None:
            return []
        left = json.dumps(
            {
                "datasource": uid,
                "queries": [{"refId": "A", "query": "${__value.raw}"}],
                "range": {"from": "${__from}", "to": "${__to}"},
            },
            sort_keys=True,
        )
        return [
            {
                "title": "Open the cycle's trace",
                "url": "/explore?left=" + urllib.parse.quote(left, safe=""),
                "targetBlank": True,
            }
        ]

    def _targets(
        self, queries: list[tuple[str, str]], exemplars: bool = False, instant: bool = False
    ) -> list[dict[str, Any]]:
        return [
            _target(
                expr,
                legend,
                chr(ord("A") + i),
                exemplar=exemplars,
                instant=instant,
                fmt="table" if instant else "time_series",
            )
            for i, (expr, legend) in enumerate(queries)
        ]

    def timeseries(
        self,
        title: str,
        description: str,
        unit: str,
        queries: list[tuple[str, str]],
        *,
        w: int = 8,
        h: int = 8,
        stack: bool = False,
        exemplars: bool = False,
        axis_label: str = "",
        minimum: float | None = 0,
        maximum: float | None = None,
        overrides: list[dict[str, Any]] | None = None,
        no_value: str = NO_TRAFFIC,
    ) -> None:
        panel_id, pos = self.layout.place(w, h)
        links = self._links(exemplars)
        defaults: dict[str, Any] = {"noValue": no_value, "mappings": _NAN_MAPPING}
        if links:
            defaults["links"] = links
        if maximum is None and unit == "percentunit":
            maximum = 1
        self.panels.append(
            g.TimeSeries(
                id=panel_id,
                gridPos=pos,
                title=title,
                description=description,
                dataSource=DATASOURCE,
                targets=self._targets(queries, exemplars),
                unit=unit,
                axisLabel=axis_label,
                stacking={"mode": "normal", "group": "A"} if stack else {"mode": "none"},
                fillOpacity=40 if stack else 10,
                valueMin=minimum,
                valueMax=maximum,
                legendDisplayMode="table",
                legendCalcs=["mean", "lastNotNull"],
                tooltipMode="multi",
                overrides=overrides or [],
                extraJson={"fieldConfig": {"defaults": defaults}},
            )
        )

    def heatmap(
        self,
        title: str,
        description: str,
        unit: str,
        expr: str,
        *,
        w: int = 8,
        h: int = 8,
        exemplars: bool = False,
    ) -> None:
        panel_id, pos = self.layout.place(w, h)
        links = self._links(exemplars)
        targets = self._targets([(expr, "{{le}}")], exemplars)
        targets[0]["format"] = "heatmap"
        self.panels.append(
            g.Heatmap(
                id=panel_id,
                gridPos=pos,
                title=title,
                description=description,
                dataSource=DATASOURCE,
                targets=targets,
                dataFormat="tsbuckets",
                yBucketBound="upper",
                hideZeroBuckets=True,
                extraJson={
                    "fieldConfig": {"defaults": {"unit": unit, "links": links}},
                    "options": {
                        "calculate": False,
                        "cellGap": 1,
                        "color": {"mode": "scheme", "scheme": "Oranges", "steps": 64},
                        "exemplars": {"color": "rgba(255,0,255,0.7)"},
                        "yAxis": {"axisPlacement": "left", "unit": unit},
                        "rowsFrame": {"layout": "auto"},
                        "tooltip": {"show": True, "yHistogram": True},
                    },
                },
            )
        )

    def stat(
        self, title: str, description: str, unit: str, expr: str, *, w: int = 4, h: int = 4
    ) -> None:
        panel_id, pos = self.layout.place(w, h)
        self.panels.append(
            g.Stat(
                id=panel_id,
                gridPos=pos,
                title=title,
                description=description,
                dataSource=DATASOURCE,
                targets=self._targets([(expr, title)]),
                format=unit,
                reduceCalc="lastNotNull",
                graphMode="area",
                decimals=None,
                noValue=NO_TRAFFIC,
                mappings=_NAN_MAPPING,
                thresholds=[{"color": "green", "value": None}],
            )
        )

    def table(
        self,
        title: str,
        description: str,
        columns: list[tuple[str, str, str]],
        *,
        w: int = WIDTH,
        h: int = 12,
        index: tuple[str, ...] = ("job", "instance"),
        row_link: dict[str, Any] | None = None,
    ) -> None:
        """``columns``: (header, unit, instant expr aggregated ``by`` the ``index`` labels).
        ``row_link``: a data link on the instance column (drill-down)."""
        panel_id, pos = self.layout.place(w, h)
        targets = self._targets([(expr, header) for header, _, expr in columns], instant=True)
        renames = {
            f"Value #{t['refId']}": header
            for t, (header, _, _) in zip(targets, columns, strict=True)
        }
        overrides = [
            {
                "matcher": {"id": "byName", "options": header},
                "properties": [{"id": "unit", "value": unit}],
            }
            for header, unit, _ in columns
        ]
        if row_link is not None:
            overrides.append(
                {
                    "matcher": {"id": "byName", "options": "instance"},
                    "properties": [{"id": "links", "value": [row_link]}],
                }
            )
        self.panels.append(
            g.Table(
                id=panel_id,
                gridPos=pos,
                title=title,
                description=description,
                dataSource=DATASOURCE,
                targets=targets,
                unit="short",
                overrides=overrides,
                extraJson={
                    "fieldConfig": {"defaults": {"noValue": NO_TRAFFIC, "mappings": _NAN_MAPPING}}
                },
                sortBy=[g.TableSortByField(displayName=columns[1][0], desc=True)],
                transformations=[
                    {"id": "merge", "options": {}},
                    {
                        "id": "organize",
                        "options": {
                            "excludeByName": {"Time": True},
                            "indexByName": {label: i for i, label in enumerate(index)},
                            "renameByName": renames,
                        },
                    },
                ],
            )
        )

    def dashboard(self, title: str, uid: str, description: str, variables: list[g.Template]) -> str:
        config = self.config
        dashboard = g.Dashboard(
            title=f"{config.dashboard_prefix}{title}",
            uid=f"{config.uid_prefix}{uid}",
            description=description,
            tags=list(config.dashboard_tags),
            editable=False,
            timezone="browser",
            refresh="30s",
            time=g.Time("now-1h", "now"),
            graphTooltip=1,
            templating=g.Templating(list=variables),
            panels=self.panels,
        )
        data = _clean(json.loads(json.dumps(dashboard.to_json_data(), cls=DashboardEncoder)))
        data["links"] = [
            {
                "title": "specobs dashboards",
                "type": "dashboards",
                "tags": list(config.dashboard_tags),
                "asDropdown": False,
                "includeVars": True,
                "keepTime": True,
                "targetBlank": False,
            }
        ]
        return json.dumps(data, sort_keys=True, indent=2, ensure_ascii=False) + "\n"


def _matchers(config: MixinConfig, *, instance: bool = True) -> str:
    """The dashboard variables as label matchers: group labels, job, model (and instance)."""
    parts = [f'{label}=~"${label}"' for label in config.group_labels]
    parts.append('job=~"$job"')
    if instance:
        parts.append('instance=~"$instance"')
    parts.append(f'{config.model_label}=~"$model"')
    return ", ".join(parts)


def _variables(config: MixinConfig, source: str, *, single_instance: bool) -> list[g.Template]:
    """``datasource``, the group labels (``cluster``, ``namespace``), ``job``, ``model`` and
    ``instance``, each query filtered by the ones before it. ``single_instance``: the instance
    variable selects one server (a per-server dashboard must not open on all of them)."""

    def query(
        name: str, label: str, matchers: list[str], all_value: str, *, multi: bool = True
    ) -> g.Template:
        selector = f"{source}{{{', '.join(matchers)}}}" if matchers else source
        return g.Template(
            name=name,
            label=label,
            query=f"label_values({selector}, {config.model_label if name == 'model' else name})",
            dataSource=DATASOURCE,
            type="query",
            refresh=2,  # on time range change, so new servers appear
            includeAll=multi,
            multi=multi,
            allValue=all_value if multi else None,
            sort=1,
            default="$__all" if multi else None,
        )

    variables = [
        g.Template(
            name="datasource",
            label="Data source",
            query="prometheus",
            type="datasource",
            default="default",
        )
    ]
    chain: list[str] = []
    # .* so that series without the label (a single cluster, no namespace) still match "All".
    for group in config.group_labels:
        variables.append(query(group, group.capitalize(), list(chain), ".*"))
        chain.append(f'{group}=~"${group}"')
    variables.append(query("job", "Job", list(chain), ".+"))
    chain.append('job=~"$job"')
    variables.append(query("model", "Model", list(chain), ".*"))
    chain.append(f'{config.model_label}=~"$model"')
    variables.append(query("instance", "Instance", list(chain), ".+", multi=not single_instance))
    return variables


def render_cycle_breakdown(config: MixinConfig) -> str:
    sel = _matchers(config)

    def s(name: str, extra: str = "") -> str:
        return f"{name}{{{sel}{', ' + extra if extra else ''}}}"

    def rate(name: str, extra: str = "") -> str:
        return f"rate({s(name, extra)}[{RATE}])"

    def srate(by: str, name: str, extra: str = "") -> str:
        return f"sum by ({by}) ({rate(name, extra)})" if by else f"sum({rate(name, extra)})"

    phase = c.PHASE_DURATION.name
    cycle = c.CYCLE_DURATION.name
    b = _Builder(config)
    # The token counts mean the same everywhere; the phase cut follows each engine's code.
    per_engine = (
        " What each phase covers depends on the engine (label engine, and "
        "specobs_info{integration}): in SGLang bookkeeping is mostly the draft model's catch-up "
        "forward, in vLLM host-side output processing, in transformers token selection and cache "
        "crop; compare phases between servers of one engine (docs/integrations.md)."
    )

    b.row("Where a cycle's time goes")
    for clock, what in (
        ("gpu", "measured on the GPU's own clock with CUDA events, on sampled cycles only"),
        ("host", "measured with perf_counter on the host, on every cycle"),
    ):
        b.timeseries(
            f"Mean time per cycle by phase ({clock.upper() if clock == 'gpu' else clock} clock)",
            f"Mean seconds each phase takes per cycle, stacked, {what}. The stack's height is the "
            "mean cycle time. Averaged over the selected instances." + per_engine,
            "s",
            [
                (
                    f"{srate('phase', phase + '_sum', GPU if clock == 'gpu' else HOST)}\n/\n("
                    f"{srate('phase', phase + '_count', GPU if clock == 'gpu' else HOST)} > 0)",
                    "{{phase}}",
                )
            ],
            stack=True,
            no_value=NO_GPU_CLOCK if clock == "gpu" else NO_TRAFFIC,
        )
    b.timeseries(
        "Mean cycle time: GPU vs host clock",
        "Mean cycle duration on each clock. Host time above GPU time is launch and Python overhead "
        "the GPU waits through; GPU above host means the host runs ahead (CUDA graphs, async).",
        "s",
        [
            (
                f"{srate('clock', cycle + '_sum')}\n/\n({srate('clock', cycle + '_count')} > 0)",
                "{{clock}}",
            )
        ],
    )
    b.timeseries(
        "Phase share of the cycle (GPU clock)",
        "Fraction of GPU cycle time spent in each phase. A growing draft share means the draft "
        "model costs more of each cycle than it used to." + per_engine,
        "percentunit",
        [
            (
                f"{srate('phase', phase + '_sum', GPU)}\n/ ignoring (phase) group_left ()\n"
                f"({srate('', phase + '_sum', GPU)} > 0)",
                "{{phase}}",
            )
        ],
        stack=True,
        no_value=NO_GPU_CLOCK,
    )
    b.timeseries(
        "Phase latency p50 / p90 / p99",
        "Quantiles of each phase's duration per clock, from the histogram buckets. Exemplars "
        "(dots) are individual sampled cycles; with a trace datasource they open the cycle's "
        "trace." + per_engine,
        "s",
        [
            (
                f"histogram_quantile({q}, {srate('phase, clock, le', phase + '_bucket')}) >= 0",
                f"{{{{phase}}}} {{{{clock}}}} p{int(q * 100)}",
            )
            for q in (0.5, 0.9, 0.99)
        ],
        exemplars=True,
    )
    b.heatmap(
        "Cycle time heatmap (host clock)",
        "Distribution of whole-cycle durations over time (host clock, every cycle). Exemplars "
        "link to traces when a trace datasource is configured.",
        "s",
        srate("le", cycle + "_bucket", HOST),
        exemplars=True,
    )
    b.timeseries(
        "Cycle time p50 / p99 by clock",
        "Quantiles of whole-cycle duration on each clock, with exemplars.",
        "s",
        [
            (
                f"histogram_quantile({q}, {srate('clock, le', cycle + '_bucket')}) >= 0",
                f"{{{{clock}}}} p{int(q * 100)}",
            )
            for q in (0.5, 0.99)
        ],
        exemplars=True,
    )

    b.row("Acceptance")
    b.timeseries(
        "Acceptance rate",
        "Accepted draft tokens / drafted tokens, per server. A draft model wired to the wrong "
        "hidden layers shows here as a collapse (e.g. 47% to 19%).",
        "percentunit",
        [
            (
                f"{srate('instance', c.ACCEPTED_TOKENS.name)}\n/\n("
                f"{srate('instance', c.DRAFT_TOKENS.name)} > 0)",
                "{{instance}}",
            )
        ],
    )
    accepted_per_sequence = (
        f"{srate('instance', c.ACCEPT_LENGTH.name + '_sum')}\n/\n"
        f"({srate('instance', c.ACCEPT_LENGTH.name + '_count')} > 0)"
    )
    b.timeseries(
        "Accepted draft tokens per sequence-cycle (excl. bonus) and acceptance length (incl. "
        "bonus)",
        "Excl. bonus: accepted draft tokens per sequence per cycle (0..k), the mean of "
        "specobs_accept_length. Incl. bonus: 1 + that, the tokens a sequence gains per cycle "
        "including the target's bonus token: the number vLLM's and SGLang's dashboards call "
        "mean acceptance length.",
        "short",
        [
            (accepted_per_sequence, "excl. bonus {{instance}}"),
            (f"1 + {accepted_per_sequence}", "incl. bonus (vLLM's definition) {{instance}}"),
        ],
        axis_label="tokens",
    )
    b.timeseries(
        "Acceptance by draft position",
        "Of the tokens drafted at each position (0 = first), the fraction accepted. Acceptance at "
        "position i is conditional on positions before it being accepted, so it falls with i.",
        "percentunit",
        [
            (
                f"{srate('position', c.ACCEPTED_BY_POSITION.name)}\n/\n("
                f"{srate('position', c.DRAFTED_BY_POSITION.name)} > 0)",
                "position {{position}}",
            )
        ],
    )
    b.heatmap(
        "Accept-length distribution",
        "How many draft tokens each sequence had accepted per cycle, over time: a mass at 0 means "
        "the draft rarely helps, a mass at k means a longer draft could pay.",
        "short",
        srate("le", c.ACCEPT_LENGTH.name + "_bucket"),
    )
    b.timeseries(
        "Batch size",
        "Sequences decoded together per cycle: mean and p90 per server. Larger batches make each "
        "cycle slower and each sequence slower, while the server emits more tokens.",
        "short",
        [
            (
                f"{srate('instance', c.BATCH_SIZE.name + '_sum')}\n/\n("
                f"{srate('instance', c.CYCLES.name)} > 0)",
                "mean {{instance}}",
            ),
            (
                f"histogram_quantile(0.9, {srate('instance, le', c.BATCH_SIZE.name + '_bucket')})"
                " >= 0",
                "p90 {{instance}}",
            ),
        ],
        axis_label="sequences",
    )

    emitted_per_sequence = (
        f"(\n  {srate('instance', c.EMITTED_TOKENS.name)}\n  /\n"
        f"  ({srate('instance', c.BATCH_SIZE.name + '_sum')} > 0)\n)"
    )
    seq_speed = (
        f"{emitted_per_sequence}\n/\n"
        f"(\n  {srate('instance', cycle + '_sum', HOST)}\n  /\n"
        f"  ({srate('instance', cycle + '_count', HOST)} > 0)\n)"
    )
    verify = f'phase="{config.verify_phase}"'
    draft_verify = f'phase=~"{config.draft_phase}|{config.verify_phase}"'
    predicted = (
        f"{emitted_per_sequence}\n* on (instance) group_right ()\n(\n"
        f"  {srate('instance, clock', phase + '_sum', verify)}\n  /\n"
        f"  ({srate('instance, clock', phase + '_sum', draft_verify)} > 0)\n)"
    )

    b.row("Throughput and speedup")
    b.timeseries(
        "Emitted tokens/s per server",
        "Tokens emitted to sequences per second (accepted draft tokens plus bonus tokens). This "
        "follows load: fewer requests, fewer tokens/s.",
        "short",
        [(srate("instance", c.EMITTED_TOKENS.name), "{{instance}}")],
        axis_label="tokens/s",
    )
    b.timeseries(
        "Tokens/s per sequence",
        "What one sequence experiences: emitted tokens per sequence per cycle over the mean host "
        "cycle time. Unlike tokens/s it does not fall when load falls.",
        "short",
        [(seq_speed, "{{instance}}")],
        axis_label="tokens/s",
    )
    b.timeseries(
        "Speedup: realized vs predicted",
        "Realized: tokens/s per sequence over the non-speculative baseline "
        f"({c.BASELINE_SEQUENCE_TOKENS.name}; the legend names its source: configured by hand, "
        "or measured by the engine at the batch size it serves, as `specobs demo` does with "
        "plain decode steps between cycles); below 1 speculation is a loss. Predicted: the "
        "measured tokens per sequence-cycle E (1 + accepted draft tokens; the per-position "
        "counters give the conditional acceptances it sums) divided by the cycle's cost in "
        "target steps, (draft + verify) / verify on each clock. It assumes a non-speculative "
        "step costs one verify and ignores bookkeeping; realized below predicted is time lost "
        "there (docs/metrics.md).",
        "none",
        [
            (
                f"{seq_speed}\n/ on (instance) group_left (source)\n(\n"
                f"  max by (instance, source) (\n    label_replace("
                f'{s(c.BASELINE_SEQUENCE_TOKENS.name)}, "source", "{BASELINE_CONFIGURED}", '
                '"source", "")\n  )\n  > 0\n)',
                "realized {{instance}} ({{source}} baseline)",
            ),
            (predicted, "predicted {{instance}} ({{clock}} clock)"),
        ],
        axis_label="x baseline",
    )

    b.row("Exporter health")
    b.timeseries(
        "Dropped records and errors",
        "Cycle records specobs dropped or could not GPU-time, by reason, and hot-path misuse by "
        "kind, per second. Anything but a trickle means the metrics undercount.",
        "short",
        [
            (srate("reason", c.DROPPED_RECORDS.name), "dropped: {{reason}}"),
            (srate("kind", c.ERRORS.name), "error: {{kind}}"),
        ],
        axis_label="per second",
    )
    b.timeseries(
        "GPU-sampled share of cycles",
        "Fraction of cycles timed with CUDA events (the GPU clock); the rest are host-timed only.",
        "percentunit",
        [
            (
                f"{srate('instance', c.SAMPLED_CYCLES.name)}\n/\n("
                f"{srate('instance', c.CYCLES.name)} > 0)",
                "{{instance}}",
            )
        ],
    )
    b.timeseries(
        "specobs CPU time per cycle",
        "CPU seconds specobs itself spends per decoding cycle, by component (budget: 15 us).",
        "s",
        [
            (
                f"{srate('component', c.EXPORTER_CPU.name)}\n/ ignoring (component) group_left ()\n"
                f"({srate('', c.CYCLES.name)} > 0)",
                "{{component}}",
            )
        ],
        stack=True,
    )
    b.timeseries(
        "GPU timing overhead",
        "Self-measured hot-path cost of GPU timing as a fraction of cycle time (budget: 0.5%).",
        "percentunit",
        [(f"max by (instance) ({s(c.OVERHEAD_RATIO.name)})", "{{instance}}")],
    )
    b.timeseries(
        "GPU sampling interval",
        "One cycle in this many is timed with CUDA events; specobs raises it to stay in budget.",
        "short",
        [(f"max by (instance) ({s(c.SAMPLING_INTERVAL.name)})", "{{instance}}")],
        axis_label="cycles",
    )
    b.timeseries(
        "Time since the last cycle",
        "Seconds since each server completed a cycle (left axis) and the requests waiting "
        "(right axis, a count). Rising while requests wait is a stall.",
        "s",
        [
            (f"time() - max by (instance) ({s(c.LAST_CYCLE_TIMESTAMP.name)})", "{{instance}}"),
            (
                f"max by (instance) ({s(c.REQUESTS_WAITING.name)})",
                "waiting requests {{instance}}",
            ),
        ],
        overrides=[
            {
                "matcher": {"id": "byRegexp", "options": "waiting requests.*"},
                "properties": [
                    {"id": "unit", "value": "short"},
                    {"id": "custom.axisPlacement", "value": "right"},
                    {"id": "custom.axisLabel", "value": "requests"},
                ],
            }
        ],
    )

    return b.dashboard(
        "cycle breakdown",
        "cycle-breakdown",
        "Where each speculative decoding cycle's time goes (draft, verify, bookkeeping on the GPU "
        "and host clocks), acceptance, throughput and speedup, per server. Generated by "
        "`specobs generate`.",
        _variables(config, c.INFO.name, single_instance=True),
    )


def render_fleet(config: MixinConfig) -> str:
    n = RuleNames(config)
    target = ", ".join(
        [
            *(f'{label}=~"${label}"' for label in config.group_labels),
            'job=~"$job"',
            'instance=~"$instance"',
        ]
    )
    sel = _matchers(config)
    model = config.model_label
    engine = config.engine_label
    k = config.outlier_count

    def s(name: str, extra: str = "", selector: str = sel) -> str:
        return f"{name}{{{selector}{', ' + extra if extra else ''}}}"

    b = _Builder(config)
    b.row("Fleet totals")
    b.stat(
        "Servers up",
        "Scrape targets of the selected jobs whose last scrape succeeded.",
        "none",
        f"sum({s(n.up, selector=target)})",
    )
    b.stat(
        "Tokens/s",
        "Tokens emitted per second across the selected servers.",
        "short",
        f"sum({s(n.emitted)})",
    )
    b.stat(
        "Acceptance rate",
        "Accepted / drafted tokens across the selected servers.",
        "percentunit",
        f"sum({s(n.accepted)})\n/\n(sum({s(n.drafted)}) > 0)",
    )
    b.stat(
        "Cycles/s",
        "Speculative decoding cycles per second across the selected servers.",
        "short",
        f"sum({s(n.cycles)})",
    )
    b.stat(
        "Median tokens/s per sequence",
        "Median over servers of what one sequence experiences.",
        "short",
        f"quantile(0.5, {s(n.sequence_speed)})",
    )
    b.stat(
        "Firing alerts",
        "specobs alerts firing for the selected servers.",
        "none",
        f"sum({s(n.alerts_firing, selector=target)})",
    )

    b.row("Servers")
    index = (*config.group_labels, "job", "instance", *config.server_labels)
    by = ", ".join(index)
    drill = {
        "title": "Cycle breakdown of ${__data.fields.instance}",
        "url": f"/d/{config.uid_prefix}cycle-breakdown?${{__url_time_range}}"
        + "".join(f"&var-{label}=${{__data.fields.{label}}}" for label in config.group_labels)
        + "&var-job=${__data.fields.job}&var-instance=${__data.fields.instance}",
    }
    gpu_share = s(n.phase_share, f'phase="{config.verify_phase}", clock="gpu"')
    host_share = s(n.phase_share, f'phase="{config.verify_phase}", clock="host"')
    b.table(
        "Servers",
        "One row per server: up, tokens/s, acceptance, p99 cycle time (host clock), verify share "
        "of the cycle (GPU clock where sampled, else host), seconds since the last cycle, and "
        "firing specobs alerts. Click an instance to open its cycle breakdown.",
        [
            ("Up", "none", f"max by ({by}) ({s(n.up, selector=target)})"),
            ("Tokens/s", "short", f"sum by ({by}) ({s(n.emitted)})"),
            ("Acceptance", "percentunit", f"max by ({by}) ({s(n.acceptance)})"),
            ("p99 cycle", "s", f"max by ({by}) ({s(n.cycle_p99, HOST)})"),
            (
                "Verify share",
                "percentunit",
                f"max by ({by}) ({gpu_share})\nor\nmax by ({by}) ({host_share})",
            ),
            ("Last cycle age", "s", f"max by ({by}) ({s(n.last_cycle_age)})"),
            ("Firing alerts", "none", f"sum by ({by}) ({s(n.alerts_firing, selector=target)})"),
        ],
        index=index,
        row_link=drill,
    )

    b.row("Outliers")
    b.timeseries(
        f"Slowest {k} servers: tokens/s per sequence",
        f"The {k} servers whose sequences decode slowest (bottom-k of the per-sequence speed).",
        "short",
        [(f"bottomk({k}, {s(n.sequence_speed)})", "{{instance}}")],
        axis_label="tokens/s",
    )
    b.timeseries(
        f"Lowest {k} acceptance rates",
        f"The {k} servers whose draft model is accepted least.",
        "percentunit",
        [(f"bottomk({k}, {s(n.acceptance)})", "{{instance}}")],
    )
    b.timeseries(
        f"Highest {k} p99 cycle times",
        f"The {k} servers with the slowest p99 cycle (host clock).",
        "s",
        [(f"topk({k}, {s(n.cycle_p99, HOST)})", "{{instance}}")],
    )

    b.row("By model and engine")
    for label in (model, engine):
        b.timeseries(
            f"Tokens/s by {label}",
            f"Tokens emitted per second, summed per {label} label.",
            "short",
            [(f"sum by ({label}) ({s(n.emitted)})", f"{{{{{label}}}}}")],
            axis_label="tokens/s",
        )
        b.timeseries(
            f"Acceptance by {label}",
            f"Accepted / drafted tokens per {label} label.",
            "percentunit",
            [
                (
                    f"sum by ({label}) ({s(n.accepted)})\n/\n"
                    f"(sum by ({label}) ({s(n.drafted)}) > 0)",
                    f"{{{{{label}}}}}",
                )
            ],
        )
        b.timeseries(
            f"Realized speedup by {label}",
            "Mean over servers of tokens/s per sequence over the non-speculative baseline, "
            f"per {label} and baseline source (configured, or measured by the engine).",
            "none",
            [(f"avg by ({label}, source) ({s(n.speedup_realized)})",
              f"{{{{{label}}}}} ({{{{source}}}} baseline)")],
            axis_label="x baseline",
        )

    b.row("Distributions across instances")
    b.heatmap(
        "Cycle time across the fleet (host clock)",
        "Distribution of cycle durations over all selected servers, from the per-server bucket "
        "rates of the recording rules.",
        "s",
        f"sum by (le) ({s(n.cycle_bucket, HOST)})",
        w=12,
    )
    b.heatmap(
        "Accept length across the fleet",
        "Distribution of accepted draft tokens per sequence per cycle over all selected servers.",
        "short",
        f"sum by (le) ({s(n.accept_length_bucket)})",
        w=12,
    )

    return b.dashboard(
        "fleet",
        "fleet",
        "Health of every speculative decoding server: throughput, acceptance, cycle time, "
        "outliers, per-model and per-engine breakdowns. Reads recording rules only. Generated by "
        "`specobs generate`.",
        _variables(config, n.cycles, single_instance=False),
    )
