"""What Prometheus and Grafana do with a dashboard's queries, in the small: enough to check that
a query's series selectors pick series out of a real scrape.

- a scrape becomes series the way Prometheus stores them: every sample with the target's labels
  added (``instance``, ``job``), the exported ones kept where both exist (``honor_labels``);
- ``label_values(metric{matchers}, label)`` is a query variable's values;
- a variable in a query (``$x``, ``${x}``) becomes its value: one value, or Grafana's "All" as
  a regex of every value (:func:`all_regex`) or the variable's own ``allValue``;
- a selector ``name{label op "value", ...}`` (``=``, ``!=``, ``=~``, ``!~``, regexes anchored as
  PromQL's are) picks the series with that name whose labels match; a label absent is ``""``.

Functions and operators around the selectors (``max by``, ``rate``, ``* 1000000``) are not
evaluated: every selector of a query must select something for its panel to show data.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from prometheus_client.parser import text_string_to_metric_families

Series = tuple[str, Mapping[str, str]]

_SELECTOR = re.compile(r"([A-Za-z_:][A-Za-z0-9_:]*)\{([^}]*)\}")
_MATCHER = re.compile(r'\s*([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)\s*"([^"]*)"\s*,?')
_LABEL_VALUES = re.compile(r"label_values\(\s*([A-Za-z_:][\w:]*)(\{[^}]*\})?\s*,\s*(\w+)\s*\)")


def scrape_series(text: str, target: Mapping[str, str]) -> list[Series]:
    """Every sample of a scrape, with the target labels Prometheus adds."""
    return [
        (s.name, {**target, **s.labels})
        for family in text_string_to_metric_families(text)
        for s in family.samples
    ]


def selectors(query: str) -> list[tuple[str, str]]:
    """Each ``(metric, matchers)`` selector of a query; a selector without braces is not
    recognised, so a query must write ``{}`` for this check to see it."""
    return _SELECTOR.findall(query)


def _matches(labels: Mapping[str, str], body: str, variables: Mapping[str, str]) -> bool:
    matchers = _MATCHER.findall(body)
    assert len("".join(m[0] + m[1] + m[2] for m in matchers)) > 0 or not body.strip(), body
    for label, op, raw in matchers:
        value = re.sub(r"\$\{?(\w+)\}?", lambda m: variables[m.group(1)], raw)
        got = labels.get(label, "")
        ok = re.fullmatch(value, got) is not None if "~" in op else got == value
        if ok == op.startswith("!"):
            return False
    return True


def select(
    series: Sequence[Series], metric: str, body: str, variables: Mapping[str, str]
) -> list[Series]:
    """The series one selector picks, its variables expanded."""
    return [
        (n, labels) for n, labels in series if n == metric and _matches(labels, body, variables)
    ]


def select_first(
    series: Sequence[Series], query: str, variables: Mapping[str, str]
) -> list[Series]:
    """The series the query's first selector picks."""
    found = selectors(query)
    assert found, query
    return select(series, *found[0], variables)


def label_values(
    series: Sequence[Series], definition: str, variables: Mapping[str, str]
) -> list[str]:
    """A ``label_values(...)`` variable's values, sorted; empty labels are no value."""
    match = _LABEL_VALUES.fullmatch(definition.strip())
    assert match is not None, definition
    metric, body, label = match.groups()
    picked = select(series, metric, (body or "{}")[1:-1], variables)
    return sorted({labels[label] for _, labels in picked if labels.get(label)})


def all_regex(values: Sequence[str]) -> str:
    """Grafana's "All" for a multi-value variable with no custom all value."""
    return "(" + "|".join(re.escape(v) for v in values) + ")"
