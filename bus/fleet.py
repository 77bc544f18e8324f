"""The fleet contract: how a worker-gateway asks every member cluster's worker for its capacity.

One subject, :data:`SUMMARY_SUBJECT`, used as a scatter-gather request: the gateway publishes a
:class:`SummaryRequest` with a reply inbox, and every member worker that hears it (its own bus,
or a bus linked to the gateway's as a NATS leaf node) answers once with a :class:`MemberSummary`:
its cluster name, whether it is ready, and its InstanceTypes' four views (exclusive, shared,
sliced, partitioned). A member that does not answer within the gateway's readiness timeout is
not Active. Member replicas answer in the queue group :func:`queue_of` their cluster, so one
cluster answers once however many replicas it runs.

Like every bus record, the wire format is a public contract between versions: camelCase, unknown
fields ignored, defaults omitted, sizes bounded so one hostile member cannot exhaust the gateway.
Everything here is pure.
"""

from __future__ import annotations

import re
from typing import Annotated, Final

import msgspec

from bus.errors import BusError

__all__ = [
    "MAX_INSTANCE_TYPES",
    "MAX_SUMMARY_BYTES",
    "SUMMARY_SUBJECT",
    "VERSION",
    "InstanceTypeSummary",
    "InvalidSummary",
    "MemberSummary",
    "PartitionedView",
    "ProfileCount",
    "SummaryRequest",
    "View",
    "Views",
    "decode_request",
    "decode_summary",
    "encode",
    "queue_of",
    "valid_cluster_name",
]

SUMMARY_SUBJECT: Final = "gpustack.v1.fleet.summary"
VERSION: Final = 1
MAX_INSTANCE_TYPES: Final = 4096
MAX_SUMMARY_BYTES: Final = 4 * 1024 * 1024
_NAME: Final = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")

Count = Annotated[int, msgspec.Meta(ge=0, le=2**53)]
Name = Annotated[str, msgspec.Meta(min_length=1, max_length=253)]


class InvalidSummary(BusError):
    """A fleet message that is not one: unreadable, too large, or with an invalid name."""


class View(msgspec.Struct, frozen=True, kw_only=True, rename="camel", omit_defaults=True):
    """What one family of an InstanceType can still grant: the largest single request, what is
    left, and the total, in the family's own unit (cards, shares, percent, instances)."""

    once_max_request: Count = 0
    remaining: Count = 0
    capacity: Count = 0


class ProfileCount(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    name: Name
    count: Count = 0


class PartitionedView(View, frozen=True, kw_only=True):
    """:class:`View` plus per-profile instance counts (every profile listed, even at 0)."""

    allocated_profiles: tuple[ProfileCount, ...] = ()
    remaining_profiles: tuple[ProfileCount, ...] = ()


class Views(msgspec.Struct, frozen=True, kw_only=True, rename="camel", omit_defaults=True):
    """An InstanceType's ``status`` four views, field for field."""

    accelerator: View = View()
    accelerator_shared: View = View()
    accelerator_sliced: View = View()
    accelerator_partitioned: PartitionedView = PartitionedView()


class InstanceTypeSummary(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One InstanceType of a member: its name (identical across clusters for the same accelerator
    group, os and arch) and its four views."""

    name: Name
    views: Views = Views()
    inactive: bool = False
    """``spec.inactive``: the type takes no new work; the gateway leaves it out of the totals."""


class MemberSummary(msgspec.Struct, frozen=True, kw_only=True, rename="camel", omit_defaults=True):
    v: int = VERSION
    cluster: Name
    ready: bool = False
    """The member's own readiness: its worker is connected and its inventory is current."""
    instance_types: tuple[InstanceTypeSummary, ...] = ()


class SummaryRequest(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    v: int = VERSION


_ENCODER: Final = msgspec.json.Encoder()
_SUMMARY: Final = msgspec.json.Decoder(MemberSummary)
_REQUEST: Final = msgspec.json.Decoder(SummaryRequest)


def encode(record: MemberSummary | SummaryRequest) -> bytes:
    return _ENCODER.encode(record)


def decode_summary(payload: bytes) -> MemberSummary:
    """A member's answer, checked: bounded size, a valid cluster name, bounded type count.

    :raises InvalidSummary: with the reason, for anything else.
    """
    if len(payload) > MAX_SUMMARY_BYTES:
        raise InvalidSummary(f"fleet summary of {len(payload)} bytes (at most {MAX_SUMMARY_BYTES})")
    try:
        summary = _SUMMARY.decode(payload)
    except msgspec.DecodeError as e:
        raise InvalidSummary(f"unreadable fleet summary: {e}") from e
    if not _NAME.fullmatch(summary.cluster):
        raise InvalidSummary(f"fleet summary names an invalid cluster {summary.cluster[:64]!r}")
    if len(summary.instance_types) > MAX_INSTANCE_TYPES:
        raise InvalidSummary(
            f"cluster {summary.cluster}: {len(summary.instance_types)} instance types "
            f"(at most {MAX_INSTANCE_TYPES})"
        )
    return summary


def decode_request(payload: bytes) -> SummaryRequest:
    """:raises InvalidSummary: an unreadable request."""
    try:
        return _REQUEST.decode(payload or b"{}")
    except msgspec.DecodeError as e:
        raise InvalidSummary(f"unreadable fleet request: {e}") from e


def valid_cluster_name(name: str) -> bool:
    """A DNS-subdomain-like name: what ``--cluster-name`` and a member's reply may carry."""
    return bool(_NAME.fullmatch(name))


def queue_of(cluster: str) -> str:
    """The queue group a cluster's worker replicas answer in: one answer per cluster."""
    return f"fleet.{cluster}"
