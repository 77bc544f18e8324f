"""The validating decision: every rule of the request model, with the reference's wording. Pure.

It runs on the Pod as the mutating webhook left it, so it also checks that the derived values are
there and right (a Pod that skipped the mutation, or a client that wrote units by hand after it,
is refused rather than trusted). The rules, numbered as in ``docs/requests.md``:

1. one accelerator family per Pod, and its claims in one container group (init or app);
2. ``<base>.sliced`` is exactly 1, with exactly one memory budget, each within its bounds;
3. ``<base>.partitioned`` is exactly 1 and names a profile;
4. one partition profile per Pod;
5. each per-profile key is exactly 1;
6. at most one container requests a slicing family (sliced or partitioned);
7. a native sidecar (an init container with ``restartPolicy: Always``) requests no accelerator.

A Pod with no accelerator claim has nothing to check.
"""

from __future__ import annotations

from collections.abc import Sequence

from controlplane.admission.folds import (
    is_pinned,
    partition_units,
    shared_problem,
    sliced_units,
)
from controlplane.admission.pods import Pod, Slot
from controlplane.admission.requests import (
    Catalog,
    Claim,
    Family,
    Fold,
    field,
    forbidden,
    invalid,
    named_groups,
    read_int,
    requests_of,
    required,
)
from controlplane.families import SLICING

__all__ = ["validate"]

Found = list[tuple[Slot, list[Claim]]]


def validate(pod: Pod, catalog: Catalog) -> list[str]:
    """Every rule the Pod breaks, as field-error messages; empty when it is admissible."""
    found = requests_of(pod)
    if not found:
        return []
    errors = [*_one_family(found), *_one_group(found), *_no_sidecar(found)]
    errors += [*_one_slicer(found), *_one_profile(found)]
    groups = named_groups(pod)
    for slot, claims in found:
        for claim in claims:
            if claim.family is Family.SLICED:
                errors += _sliced(slot, claim, groups, catalog)
            elif claim.family is Family.PARTITIONED:
                errors += _partitioned(slot, claim, groups, catalog)
    return errors + _shared(pod, found)


def _one_family(found: Found) -> list[str]:
    families = {(c.base, c.family) for _, claims in found for c in claims}
    if len(families) < 2:
        return []
    one_base = len({base for base, _ in families}) == 1
    names = sorted(f.value if one_base else f"{base}:{f.value}" for base, f in families)
    return [
        forbidden(
            "spec", f"a Pod may request only one accelerator family, found [{' '.join(names)}]"
        )
    ]


def _one_group(found: Found) -> list[str]:
    groups = {slot.group for slot, _ in found}
    if not {"init", "app"} <= groups:
        return []
    return [
        forbidden(
            "spec.initContainers",
            "a Pod's accelerator requests must all sit in one container group; "
            "spec.initContainers must give up its request, because its devices are held for "
            "the Pod's whole life while the scheduler charges the Pod only once",
        )
    ]


def _no_sidecar(found: Found) -> list[str]:
    return [
        forbidden(
            field(slot),
            "a restartable init container (a native sidecar) may not request an accelerator; "
            "move the request to an app container",
        )
        for slot, _ in found
        if slot.group == "sidecar"
    ]


def _one_slicer(found: Found) -> list[str]:
    slicers = sum(1 for _, claims in found if any(c.family in SLICING for c in claims))
    if slicers < 2:
        return []
    return [
        forbidden("spec", f"at most one container may request a slicing family, found {slicers}")
    ]


def _one_profile(found: Found) -> list[str]:
    profiles = sorted({p for _, claims in found for c in claims for _, p in c.profiles()})
    if len(profiles) < 2:
        return []
    return [
        forbidden(
            "spec", f"a Pod may request only one partition profile, found [{' '.join(profiles)}]"
        )
    ]


def _exactly_one(slot: Slot, claim: Claim, key: str, detail: str, missing: str) -> list[str]:
    count, errors = read_int(slot, claim, key)
    if errors:
        return list(errors)
    if count is None:
        return [required(field(slot, key), missing)]
    return [] if count == 1 else [invalid(field(slot, key), claim.values[key], detail)]


def _sliced(slot: Slot, claim: Claim, groups: Sequence[str], catalog: Catalog) -> list[str]:
    key = claim.key(".sliced")
    errors = _exactly_one(
        slot, claim, key,
        "a logical slice request is always a single accelerator; "
        "multi-accelerator logical slicing is not supported yet",
        f"a logical slice is requested with {key}: 1",
    )  # fmt: skip
    cores_key = claim.key(".sliced.cores-percentage")
    cores, bad = read_int(slot, claim, cores_key)
    errors += bad
    if cores is not None and not 0 < cores <= 100:
        errors.append(
            invalid(field(slot, cores_key), claim.values[cores_key], "must be within (0, 100]")
        )
    fold = sliced_units(slot, claim, groups, catalog)
    return errors + _units(slot, claim, claim.key(".sliced.units"), fold)


def _partitioned(slot: Slot, claim: Claim, groups: Sequence[str], catalog: Catalog) -> list[str]:
    key = claim.key(".partitioned")
    errors = _exactly_one(
        slot, claim, key,
        "a partition request is always a single accelerator; request one Pod per instance",
        f"a partition is requested with {key}: 1",
    )  # fmt: skip
    profiles = claim.profiles()
    if not profiles:
        example = f"{key}.<kind>-<profile>"
        errors.append(required(field(slot), f"a {key} request must name a profile, e.g. {example}"))
    for profile_key, _ in profiles:
        errors += _exactly_one(
            slot, claim, profile_key,
            "a partition profile request must be exactly 1 instance", "",
        )  # fmt: skip
    fold = partition_units(slot, claim, groups, catalog)
    return errors + _units(slot, claim, claim.key(".partitioned.units"), fold)


def _units(slot: Slot, claim: Claim, key: str, fold: Fold) -> list[str]:
    """The fold's errors, else whether the Pod carries exactly the folded units."""
    if fold.units is None:
        return list(fold.errors)
    raw = claim.values.get(key)
    if raw is None:
        return [required(field(slot, key), f"the mutating webhook sets it to {fold.units}")]
    value, errors = read_int(slot, claim, key)
    if errors or value == fold.units:
        return list(errors)
    detail = f"must be {fold.units}, the memory budget folded into units; never set it by hand"
    return [invalid(field(slot, key), raw, detail)]


def _shared(pod: Pod, found: Found) -> list[str]:
    counts = [
        (count or 0, claim.base)
        for slot, claims in found
        for claim in claims
        if claim.family is Family.SHARED
        for count in [read_int(slot, claim, claim.key(".shared"))[0]]
    ]
    if not counts or max(counts)[0] < 2:
        return []
    cards, base = max(counts)
    terms = pod.required_terms()
    if terms and all(is_pinned(t, cards) for t in terms):
        return []
    return [shared_problem(base, cards)]
