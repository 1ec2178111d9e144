"""House-style Grafana panels: the one module that imports grafanalib.

:class:`PanelBuilder` places panels on a 24-column grid with fixed ids and grid positions, binds
every target to the ``$datasource`` variable, gives every panel a unit, a description and a "No
traffic" mapping, and turns grafanalib's output into JSON valid for Grafana's current schema
(:func:`_clean`). :func:`dashboard_variables` builds the ``datasource``, group, ``job``, ``model``
and ``instance`` variables. What the panels show lives in :mod:`specobs.mixin._dashboards`.
"""

from __future__ import annotations

import json
import urllib.parse
from dataclasses import dataclass
from typing import Any

from grafanalib import core as g
from grafanalib._gen import DashboardEncoder

from specobs.mixin._config import MixinConfig

__all__ = [
    "DATASOURCE",
    "NEEDS_PLUGIN",
    "NEEDS_PLUGIN_VALUE",
    "NO_GPU_CLOCK",
    "NO_TRAFFIC",
    "RATE",
    "SCHEMA_VERSION",
    "WIDTH",
    "PanelBuilder",
    "dashboard_queries",
    "dashboard_variables",
    "fill_variables",
]

DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
#: The dashboard schema Grafana 11 writes; Grafana migrates older files on every load.
SCHEMA_VERSION = 39
NO_TRAFFIC = "No traffic"
#: What a GPU-clock-only panel shows on a busy server with no GPU-timed cycle (a CPU engine, or
#: no sampled cycle in the window): not "No traffic", which would be wrong there.
NO_GPU_CLOCK = "No GPU-timed cycles"
#: What a panel or a table cell shows for servers read through their engine's own series where
#: the figure needs specobs's plugin (phase timing, cycles, batch, speedup).
NEEDS_PLUGIN = "Needs specobs's plugin"
#: The value a table query gives such a cell; the cell maps it to :data:`NEEDS_PLUGIN`.
NEEDS_PLUGIN_VALUE = -1
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
        row = {k: v for k, v in panel.items() if k in _ROW_KEYS}
        row["panels"] = [_clean_panel(p) for p in row.get("panels") or []]
        return row
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
    for panel in [q for p in data["panels"] for q in (p, *p.get("panels", []))]:
        steps = panel.get("fieldConfig", {}).get("defaults", {}).get("thresholds", {}).get("steps")
        if steps:
            steps[0]["value"] = None
    return data


RATE = "$__rate_interval"
WIDTH = 24


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


class PanelBuilder:
    """Collects the panels of one dashboard in order and renders the dashboard."""

    def __init__(self, config: MixinConfig) -> None:
        self.config = config
        self.layout = _Layout()
        self.panels: list[g.Panel] = []
        #: Where the next panel goes: the dashboard's list, or a collapsed row's own.
        self._into: list[g.Panel] = self.panels

    def row(self, title: str, *, collapsed: bool = False) -> None:
        """Start a row. A collapsed row holds the panels after it (Grafana shows them when the
        row is opened); they keep the positions they would have below it."""
        self.layout.newline()
        panel_id, pos = self.layout.place(WIDTH, 1)
        self.layout.newline()
        inside: list[g.Panel] = []
        self.panels.append(g.RowPanel(title=title, id=panel_id, gridPos=pos, collapsed=collapsed,
                                      panels=inside))
        self._into = inside if collapsed else self.panels

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

    def _add(
        self, panel: Any, w: int, h: int, title: str, description: str,
        targets: list[dict[str, Any]], **options: Any,
    ) -> None:
        """Place a panel of ``w`` x ``h`` in the layout and append it with what every panel
        here shares (id, position, title, description, the datasource, the targets)."""
        panel_id, pos = self.layout.place(w, h)
        self._into.append(panel(
            id=panel_id, gridPos=pos, title=title, description=description,
            dataSource=DATASOURCE, targets=targets, **options,
        ))

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
        threshold_line: float | None = None,
    ) -> None:
        """``threshold_line``: a dashed line across the panel at that value (red below it)."""
        links = self._links(exemplars)
        defaults: dict[str, Any] = {"noValue": no_value, "mappings": _NAN_MAPPING}
        if links:
            defaults["links"] = links
        if threshold_line is not None:
            defaults["thresholds"] = {"mode": "absolute", "steps": [
                {"color": "red", "value": None}, {"color": "green", "value": threshold_line}]}
            defaults["custom"] = {"thresholdsStyle": {"mode": "dashed"}}
        if maximum is None and unit == "percentunit":
            maximum = 1
        self._add(
            g.TimeSeries, w, h, title, description, self._targets(queries, exemplars),
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
        no_value: str = NO_TRAFFIC,
    ) -> None:
        links = self._links(exemplars)
        targets = self._targets([(expr, "{{le}}")], exemplars)
        targets[0]["format"] = "heatmap"
        self._add(
            g.Heatmap, w, h, title, description, targets,
            dataFormat="tsbuckets",
            yBucketBound="upper",
            hideZeroBuckets=True,
            extraJson={
                "fieldConfig": {"defaults": {"unit": unit, "links": links,
                                             "noValue": no_value}},
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

    def stat(
        self, title: str, description: str, unit: str, expr: str, *, w: int = 4, h: int = 4,
        red_below: float | None = None, decimals: int | None = None, no_value: str = NO_TRAFFIC,
    ) -> None:
        """One number, its sparkline behind it. ``red_below``: red under that value, green
        from it (speedup below 1), else one neutral colour."""
        steps = [{"color": "green", "value": None}] if red_below is None else [
            {"color": "red", "value": None}, {"color": "green", "value": red_below}]
        self._add(
            g.Stat, w, h, title, description, self._targets([(expr, title)]),
            format=unit,
            reduceCalc="lastNotNull",
            graphMode="area",
            decimals=decimals,
            noValue=no_value,
            mappings=_NAN_MAPPING,
            thresholds=steps,
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
        colours: dict[str, list[tuple[str, float | None]]] | None = None,
        plugin_only: frozenset[str] = frozenset(),
    ) -> None:
        """``columns``: (header, unit, instant expr aggregated ``by`` the ``index`` labels).
        ``row_link``: a data link on the instance column (drill-down). ``colours``: header ->
        threshold steps (colour, from value; the first from -inf): that column's cells are
        coloured by them. ``plugin_only``: headers whose query gives :data:`NEEDS_PLUGIN_VALUE`
        for a server without the plugin; such a cell reads :data:`NEEDS_PLUGIN`."""
        targets = self._targets([(expr, header) for header, _, expr in columns], instant=True)
        renames = {
            f"Value #{t['refId']}": header
            for t, (header, _, _) in zip(targets, columns, strict=True)
        }
        overrides = []
        for header, unit, _ in columns:
            props: list[dict[str, Any]] = [{"id": "unit", "value": unit}]
            steps = (colours or {}).get(header)
            if steps:
                props += [
                    {"id": "custom.cellOptions", "value": {"type": "color-background"}},
                    {"id": "thresholds", "value": {"mode": "absolute", "steps": [
                        {"color": colour, "value": value} for colour, value in steps]}},
                ]
            if header in plugin_only:
                props.append({"id": "mappings", "value": [*_NAN_MAPPING, {
                    "type": "value", "options": {str(NEEDS_PLUGIN_VALUE): {
                        "text": NEEDS_PLUGIN, "color": "transparent", "index": 1}}}]})
            overrides.append({"matcher": {"id": "byName", "options": header},
                              "properties": props})
        if row_link is not None:
            overrides.append(
                {
                    "matcher": {"id": "byName", "options": "instance"},
                    "properties": [{"id": "links", "value": [row_link]}],
                }
            )
        self._add(
            g.Table, w, h, title, description, targets,
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

    def dashboard(self, title: str, uid: str, description: str, variables: list[g.Template],
                  *, engine_links: bool = False) -> str:
        """``engine_links``: also a dropdown of the engines' own dashboards (by the tags in
        ``MixinConfig.engine_dashboard_tags``)."""
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
        if engine_links and config.engine_dashboard_tags:
            data["links"].append({
                "title": "Engine dashboards",
                "type": "dashboards",
                "tags": list(config.engine_dashboard_tags),
                "asDropdown": True,
                "includeVars": False,
                "keepTime": True,
                "targetBlank": True,
            })
        return json.dumps(data, sort_keys=True, indent=2, ensure_ascii=False) + "\n"


def dashboard_variables(
    config: MixinConfig, source: str, *, single_instance: bool, engine: bool = False
) -> list[g.Template]:
    """``datasource``, the group labels (``cluster``, ``namespace``), ``job``, ``model``, with
    ``engine`` the serving engine (``MixinConfig.engine_label``), and ``instance``, each query
    filtered by the ones before it, then ad-hoc filters (any other label: a DP rank, an engine
    index, a pod). ``single_instance``: the instance variable opens on one server (a per-server
    dashboard must not open on all of them); more can be picked."""

    def query(
        name: str, label: str, matchers: list[str], all_value: str, *, opens_on_all: bool = True
    ) -> g.Template:
        selector = f"{source}{{{', '.join(matchers)}}}" if matchers else source
        return g.Template(
            name=name,
            label=label,
            query=f"label_values({selector}, {config.model_label if name == 'model' else name})",
            dataSource=DATASOURCE,
            type="query",
            refresh=2,  # on time range change, so new servers appear
            includeAll=True,
            multi=True,
            allValue=all_value,
            sort=1,
            default="$__all" if opens_on_all else None,
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
    if engine:
        label = config.engine_label
        variables.append(query(label, "Engine", list(chain), ".*"))
        chain.append(f'{label}=~"${label}"')
    variables.append(
        query("instance", "Instance", list(chain), ".+", opens_on_all=not single_instance))
    variables.append(g.Template(name="filters", label="Filters", query="", type="adhoc",
                                dataSource=DATASOURCE))
    return variables


def dashboard_queries(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    """(panel title, PromQL) of every query target of a generated dashboard, in panel order."""
    out: list[tuple[str, str]] = []

    def walk(panels: list[dict[str, Any]]) -> None:
        for p in panels:
            walk(p.get("panels", []))
            for i, t in enumerate(p.get("targets", [])):
                if t.get("expr"):
                    out.append((f"{p.get('title', '?')} [{t.get('refId', i)}]", t["expr"]))

    walk(dashboard.get("panels", []))
    return out


def fill_variables(expr: str, rate_interval: str, values: dict[str, str] | None = None) -> str:
    """Grafana's variables as a dashboard opened on everything (or on ``values``) sends them."""
    values = values or {}
    expr = expr.replace("$__rate_interval", rate_interval).replace("$__interval", rate_interval)
    for var in ("cluster", "namespace", "job", "model", "serving_engine", "instance"):
        expr = expr.replace(f"${var}", values.get(var, ".*"))
    return expr
