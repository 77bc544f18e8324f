"""The chain's node labels, decided (pure): which labels a Node should carry, and when to look.

A managed node (label :data:`naming.MANAGED` ``true``, set here unless node management is
manual) carries its general key label, a profile label (the default one only when none is set:
the user may choose another) and the fit labels of :func:`fit.fit_labels`, and ``cpu-only`` where :func:`kueue.node_labels`
says so. Owned keys (fit labels, general keys, ``cpu-only``) the node should no longer carry are removed; any other label is left alone.

:func:`signature` is what a node's facts and labels are made of: two equal signatures give equal
labels and facts, so the reconciler looks again only at nodes whose signature changed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from controlplane.chain import fit, kueue, naming
from controlplane.chain.inventory import NodeFacts, facts_of
from controlplane.chain.settings import ChainSettings
from controlplane.reconciling.nodestates import NodeState

__all__ = ["Labelling", "label_patch", "signature"]

Signature = tuple[Any, ...]


def signature(
    body: Mapping[str, Any], state: NodeState | None, settings: ChainSettings
) -> Signature:
    """What a node's facts and labels are made of: equal signatures, equal results."""
    meta = body.get("metadata") or {}
    return (
        tuple(sorted((meta.get("labels") or {}).items())),
        tuple(sorted((meta.get("annotations") or {}).items())),
        repr((body.get("status") or {}).get("allocatable") or body.get("status")),
        state.groups if state else None,
        tuple(state.allocations.values()) if state else None,
        # the settings the labels follow: a change re-labels every node
        (settings.node_management_manual, settings.instance_type_mixed_on_node),
    )


@dataclass(frozen=True, slots=True)
class Labelling:
    """One node's decision: the label patch (``{}``: nothing to write; ``None`` removes a key)
    and the node's facts (``None``: not managed)."""

    patch: dict[str, str | None]
    facts: NodeFacts | None


def label_patch(
    body: Mapping[str, Any], state: NodeState | None, settings: ChainSettings
) -> Labelling:
    """The labels ``body`` should carry, as a patch of only what differs."""
    labels: Mapping[str, str] = (body.get("metadata") or {}).get("labels") or {}
    want: dict[str, str | None] = {}
    if not settings.node_management_manual:
        want[naming.MANAGED] = "true"
    facts = None
    if want.get(naming.MANAGED, labels.get(naming.MANAGED)) == "true":
        facts = facts_of(body, state)
        want[f"{naming.GENERAL_PREFIX}{facts.general}"] = "true"
        want.update(kueue.node_labels(facts, settings))
        if naming.PROFILE not in labels:
            want[naming.PROFILE] = naming.DEFAULT_PROFILE
        want.update(fit.fit_labels(facts))
    for key in labels:
        owned = (
            fit.is_fit_label(key) or key.startswith(naming.GENERAL_PREFIX) or key == naming.CPU_ONLY
        )
        if owned and key not in want:
            want[key] = None
    return Labelling({k: v for k, v in want.items() if labels.get(k) != v}, facts)
