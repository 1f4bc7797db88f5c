"""deploy/grafana/rm-qdrant-migration.json: every metric its PromQL queries (parsed with a real
PromQL parser) is one rm-qdrant exports, with labels that metric has; every metric exported is
shown; the dashboard imports with a Prometheus data source chosen at import and a pair variable."""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterator
from typing import Any

import promql_parser
import pytest

from tests.deploy.manifests import DEPLOY

DASHBOARD = DEPLOY / "grafana" / "rm-qdrant-migration.json"
HISTOGRAM_SERIES = ("_bucket", "_sum", "_count")
#: Grafana's own variables that stand for a range in a query; a query is parsed with a range there.
GRAFANA_RANGES = ("$__rate_interval", "$__interval", "$__range")
DATASOURCE = {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}


def exported_metric_names() -> dict[str, tuple[str, frozenset[str]]]:
    """Every metric rm-qdrant exports: name -> (kind, labels). The names and kinds are checked
    against the exporter's own registry (:func:`test_the_label_list_is_the_exporters`); the
    labels of a family without samples yet (the pair's gauges before a read) are not in it."""
    migration = {
        "rmq_gallery_points": ("gauge", {"pair"}),
        "rmq_migrated_points": ("gauge", {"pair"}),
        "rmq_remaining_points": ("gauge", {"pair"}),
        "rmq_failed_points": ("gauge", {"pair"}),
        "rmq_migrate_moved_points_total": ("counter", {"pair"}),
        "rmq_migrate_failed_points_total": ("counter", {"pair"}),
        "rmq_migrate_points_per_second": ("gauge", {"pair"}),
        "rmq_migrate_eta_seconds": ("gauge", {"pair"}),
        "rmq_migrate_batch_seconds": ("histogram", {"pair", "stage"}),  # fetch|decode|encode|write
        "rmq_migrate_retries_total": ("counter", {"pair"}),
        "rmq_pair_state": ("gauge", {"pair", "state"}),  # 1 for the current state
        "rmq_migrate_paused": ("gauge", {"pair"}),
    }
    search = {
        "rmq_search_seconds": ("histogram", {"pair", "side"}),  # old|new|total
        "rmq_search_hits_total": ("counter", {"pair", "side"}),  # old|new: where merged hits came from
        "rmq_searches_total": ("counter", {"pair"}),
    }
    return {name: (kind, frozenset(labels)) for name, (kind, labels) in {**migration, **search}.items()}


def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text(encoding="utf-8"))


def panels(board: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel, those inside collapsed rows too."""
    for panel in board.get("panels", []):
        yield panel
        yield from panel.get("panels", [])


def queries(board: dict[str, Any]) -> list[tuple[str, str]]:
    """(where, PromQL) of every panel target and every query variable (label_values' selector)."""
    found = [
        (f"panel {p['title']!r} {t.get('refId')}", t["expr"])
        for p in panels(board)
        for t in p.get("targets", [])
    ]
    for variable in board.get("templating", {}).get("list", []):
        if variable.get("type") == "query":
            query = variable["query"]["query"] if isinstance(variable["query"], dict) else variable["query"]
            match = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", query.strip())
            assert match, f"variable {variable['name']}: {query!r} is not label_values(SELECTOR, LABEL)"
            found.append((f"variable {variable['name']}", f"group by ({match.group(2)}) ({match.group(1)})"))
    return found


def parse(expr: str) -> promql_parser.Expr:
    for grafana in GRAFANA_RANGES:
        expr = expr.replace(grafana, "5m")
    return promql_parser.parse(expr)


def selectors_and_labels(tree: promql_parser.Expr) -> tuple[list[str], set[str]]:
    """The metric names an expression selects, and every label it names (in matchers, and in
    by/without/on/ignoring clauses)."""
    names: list[str] = []
    labels: set[str] = set()

    def visit(node: Any) -> None:
        if isinstance(node, promql_parser.MatrixSelector):
            node = node.vector_selector
        if isinstance(node, promql_parser.VectorSelector):
            matchers = node.matchers.matchers + [m for group in node.matchers.or_matchers for m in group]
            named = [m.value for m in matchers if m.name == "__name__"]
            names.extend(([node.name] if node.name else []) + named)
            labels.update(m.name for m in matchers if m.name != "__name__")
            return
        modifier = getattr(node, "modifier", None)
        for clause in (modifier, getattr(modifier, "matching", None)):
            labels.update(getattr(clause, "labels", None) or [])
        labels.update(getattr(modifier, "group_labels", None) or [])
        for child in ("expr", "lhs", "rhs", "param"):
            if isinstance(getattr(node, child, None), promql_parser.Expr):
                visit(getattr(node, child))
        for arg in getattr(node, "args", None) or []:
            visit(arg)

    visit(tree)
    return names, labels


def exported_as(series: str, exported: dict[str, tuple[str, frozenset[str]]]) -> str | None:
    """The exported metric a series name belongs to: itself, or the histogram of its
    _bucket/_sum/_count series; None if rm-qdrant exports no such series."""
    if series in exported and exported[series][0] != "histogram":
        return series
    for suffix in HISTOGRAM_SERIES:
        base = series.removesuffix(suffix)
        if series.endswith(suffix) and exported.get(base, ("",))[0] == "histogram":
            return base
    return None


def check_queries(board: dict[str, Any]) -> set[str]:
    """Every query selects exported series by labels they have; returns the metrics used."""
    exported = exported_metric_names()
    used: set[str] = set()
    for where, expr in queries(board):
        names, labels = selectors_and_labels(parse(expr))
        assert names, f"{where}: {expr!r} selects no metric"
        metrics = [exported_as(n, exported) for n in names]
        unknown = [n for n, m in zip(names, metrics) if m is None]
        assert not unknown, f"{where}: {unknown} is not a series rm-qdrant exports"
        have = set().union(*(exported[m][1] for m in metrics))
        if any(n.endswith("_bucket") for n in names):
            have.add("le")
        assert labels <= have, f"{where}: labels {sorted(labels - have)} on none of {sorted(set(metrics))}"
        used.update(m for m in metrics if m)
    return used


def test_the_parser_finds_every_selector_and_label():
    expr = (
        'histogram_quantile(0.99, sum by (le, stage) (rate(a_bucket{pair=~"$pair"}[$__rate_interval])))'
        ' / on (pair) group_left max by (pair) (b{side="old"}) + count({__name__="c"})'
    )
    names, labels = selectors_and_labels(parse(expr))
    assert sorted(names) == ["a_bucket", "b", "c"]
    assert labels == {"le", "stage", "pair", "side"}


def test_every_queried_metric_is_one_rm_qdrant_exports():
    check_queries(dashboard())


def test_every_exported_metric_is_on_the_dashboard():
    assert check_queries(dashboard()) == set(exported_metric_names())


@pytest.mark.parametrize(
    ("old", "new"),
    [
        pytest.param("rmq_migrated_points{", "rmq_migrated_point{", id="misspelled-metric"),
        pytest.param("sum by (le, stage)", "sum by (le, stages)", id="label-it-lacks"),
        pytest.param("rmq_migrate_batch_seconds_bucket", "rmq_migrate_batch_seconds", id="histogram-itself"),
        pytest.param("rmq_remaining_points{", "rmq_remaining_points_bucket{", id="bucket-of-a-gauge"),
        pytest.param("[$__rate_interval]", "[$rate]", id="unparsable"),
    ],
)
def test_the_query_check_fails_on_a_broken_query(old, new):
    board = dashboard()
    text = json.dumps(board)
    assert old in text
    with pytest.raises((AssertionError, ValueError)):
        check_queries(json.loads(text.replace(old, new, 1)))


def test_it_imports_with_a_prometheus_chosen_at_import():
    board = dashboard()
    inputs = {i["name"]: i for i in board["__inputs"]}
    prometheus = inputs["DS_PROMETHEUS"]
    assert prometheus["type"] == "datasource" and prometheus["pluginId"] == "prometheus"
    for panel in panels(board):
        if panel["type"] != "row":
            assert panel["datasource"] == DATASOURCE, panel["title"]
            assert all(t["datasource"] == DATASOURCE for t in panel["targets"]), panel["title"]
    assert all(v["datasource"] == DATASOURCE for v in board["templating"]["list"])
    assert board["uid"] and board["id"] is None  # import creates it; a fixed uid keeps links stable


def test_every_variable_a_query_uses_is_defined():
    board = dashboard()
    defined = {v["name"] for v in board["templating"]["list"]}
    assert "pair" in defined
    for where, expr in queries(board):
        used = set(re.findall(r"\$\{?(\w+)", expr)) - {g.lstrip("$") for g in GRAFANA_RANGES}
        assert used <= defined, f"{where}: undefined {used - defined}"


def test_panels_have_unique_ids_and_do_not_overlap():
    board = dashboard()
    ids = [p["id"] for p in panels(board)]
    assert len(ids) == len(set(ids))
    cells: dict[tuple[int, int], str] = {}
    for panel in panels(board):
        pos = panel["gridPos"]
        assert pos["x"] + pos["w"] <= 24, panel["title"]
        for x in range(pos["x"], pos["x"] + pos["w"]):
            for y in range(pos["y"], pos["y"] + pos["h"]):
                assert (x, y) not in cells, f"{panel['title']!r} overlaps {cells[(x, y)]!r}"
                cells[(x, y)] = panel["title"]


def test_a_dashboard_without_targets_would_fail_the_export_check():
    board = copy.deepcopy(dashboard())
    for panel in panels(board):
        panel["targets"] = []
    with pytest.raises(AssertionError):
        assert check_queries(board) == set(exported_metric_names())


def test_the_label_list_is_the_exporters():
    """The names and kinds above are what rm_qdrant.monitoring registers, not a copy kept apart."""
    from prometheus_client import CollectorRegistry

    from rm_qdrant.monitoring import MigrationMetrics, SearchMetrics
    from rm_qdrant.monitoring import exported_metric_names as real

    registry = CollectorRegistry()
    MigrationMetrics(registry, "pair")
    SearchMetrics(registry)
    kinds = {(f"{m.name}_total" if m.type == "counter" else m.name): m.type for m in registry.collect()}
    listed = exported_metric_names()
    assert set(listed) == real() == set(kinds)
    assert {name: kind for name, (kind, _) in listed.items()} == kinds
