"""The ``Setting`` catalog: every cluster-wide setting the worker reads, its type, default and rules.

Pure data and pure functions. A setting is stored as text (a data key of the Secret
``gpustack-settings`` in the system namespace, or a key of the bus's ledger bucket under
``--kubeconfig=none``); :func:`parse` turns the whole text map into one frozen :class:`Values`,
which is what reconcilers and webhooks read. Invariants:

- a stored text is either valid for its entry or replaced by the entry's default when parsed
  (with the problem reported), so a bad edit never stops the worker; a bad *seed* from the
  environment does (:func:`seed` raises), because that is a deployment mistake to see at once;
- the catalog is fixed: no setting is created or deleted through the API, only edited;
- a sensitive value is never shown (:func:`shown`); a proxy URL never carries credentials;
- a text is read by the one parser of its type (:mod:`kit.values`, shared with the flags and the
  webhooks): Go's forms exactly (``8``, never `` 8``, ``1_6`` or full-width digits; ``true``/
  ``false``/``1``/``0``..., never ``yes``/``on``; ``1h30m``), at most 4096 characters, a URL at
  most 2048.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Final

import msgspec

from hub.urls import Url
from kit import values as parsers
from kit.redaction import redact_urls

__all__ = [
    "BY_NAME",
    "CATALOG",
    "CHAIN_SETTINGS",
    "DEFAULTS",
    "MASK",
    "SECRET_NAME",
    "Entry",
    "InvalidSetting",
    "Values",
    "backfill",
    "chain_fields",
    "check",
    "parse",
    "seed",
    "shown",
    "validate_all",
]

SECRET_NAME: Final = "gpustack-settings"
MASK: Final = "(sensitive)"
INERT_NOTE: Final = "stored for compatibility; this build does not act on it"


class InvalidSetting(ValueError):
    """A setting's text breaks its entry's rules (the message names the setting)."""


_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def _url(text: str, *, proxy: bool = False) -> str:
    if proxy and not text:
        return ""
    parsers.bounded(text, parsers.MAX_URL, "URL")
    try:
        parsed = Url(text)  # the Hub client's own parser: what it would refuse, refused here
    except ValueError as e:
        raise ValueError(redact_urls(str(e))) from e
    if proxy and (parsed.user is not None or parsed.password is not None):
        raise ValueError("a proxy URL may not carry credentials (user or password)")
    return text.rstrip("/") if not proxy else text


def _bytes_per_second(text: str) -> int:
    value = parsers.parse_quantity(text)
    if value < 0 or value.denominator != 1:
        raise ValueError("not a whole, non-negative quantity of bytes per second")
    return int(value)


def _no_proxy(text: str) -> str:
    for item in filter(None, (i.strip() for i in text.split(","))):
        host = item.lstrip(".").split(":")[0]
        try:
            ipaddress.ip_network(item, strict=False)
        except ValueError:
            if not re.fullmatch(r"[A-Za-z0-9*]([-A-Za-z0-9.*]*[A-Za-z0-9])?", host):
                raise ValueError(f"{item!r} is not a host, domain or CIDR") from None
    return text


def _config_map(text: str) -> str:
    if text and (len(text) > 253 or not _DNS_SUBDOMAIN.fullmatch(text)):
        raise ValueError("not a ConfigMap name")
    return text


def _int(low: int, high: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        return parsers.parse_int(text, low, high)

    return parse


def _one_of(*choices: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if text not in choices:
            raise ValueError(f"must be one of {', '.join(choices)}")
        return text

    return parse


def _image(text: str) -> str:
    if not text or len(text) > 512 or any(c.isspace() for c in text):
        raise ValueError("not a container image reference")
    return text


def _at_least_minute(text: str) -> float:
    seconds = parsers.parse_duration(text)
    if seconds < 60:
        raise ValueError("must be at least 1m")
    return seconds


@dataclass(frozen=True)
class Entry:
    """One setting. ``field`` names its attribute on :class:`Values`."""

    name: str
    default: str
    description: str
    convert: Callable[[str], object]
    field: str
    editable: bool = True
    sensitive: bool = False
    inert: bool = False
    """Stored, validated and shown for compatibility with the reference's seeds, but read by
    nothing in this build: the API says so in its description and warns on every write."""

    @property
    def shown_description(self) -> str:
        """The description as the API shows it (an inert setting says it has no effect)."""
        return f"{self.description} ({INERT_NOTE})" if self.inert else self.description

    @property
    def env(self) -> str:
        """``GPUSTACK_<UPPER_SNAKE_NAME>``: what seeds it on the first start."""
        return "GPUSTACK_" + self.name.upper().replace("-", "_")


def _entry(
    name: str, default: str, description: str, convert: Callable[[str], object], **kw: bool
) -> Entry:
    return Entry(name, default, description, convert, name.replace("-", "_"), **kw)


CATALOG: Final[tuple[Entry, ...]] = (
    _entry(
        "model-artifact-delivery-mode", "Engine",
        "how model files reach workloads: the engine downloads them (Engine) or the node cache "
        "serves them (Node); seeded once, not editable", _one_of("Engine", "Node"),
        editable=False, inert=True,
    ),
    _entry(
        "model-artifact-huggingface-endpoint", "https://huggingface.co",
        "the Hugging Face Hub ModelArtifacts resolve against and nodes download from", _url,
    ),
    _entry(
        "model-artifact-modelscope-endpoint", "https://www.modelscope.cn",
        "the ModelScope endpoint ModelArtifacts with source.modelScope resolve against and "
        "nodes download from", _url,
    ),
    _entry(
        "model-artifact-https-proxy", "",
        "HTTPS proxy for Hub traffic (http(s) URL without credentials; empty: none)",
        lambda text: _url(text, proxy=True), sensitive=True,
    ),
    _entry(
        "model-artifact-no-proxy", "", "hosts, domains and CIDRs reached without the proxy",
        _no_proxy,
    ),
    _entry(
        "model-artifact-ca-bundle", "",
        "ConfigMap (operator namespace, key ca.crt) with extra CAs for the Hub", _config_map,
    ),
    _entry(
        "model-artifact-revalidate-interval", "24h",
        "how often a resolved ModelArtifact is checked against the Hub again (a Go duration, at "
        "least 1m)",
        _at_least_minute,
    ),
    _entry(
        "model-store-high-watermark", "80",
        "cache use (percent) above which unreferenced models are collected (2..95, above the "
        "low watermark)", _int(2, 95),
    ),
    _entry(
        "model-store-low-watermark", "70",
        "cache use (percent) collection brings the cache down to (1..94)", _int(1, 94),
    ),
    _entry(
        "model-store-download-concurrency", "8", "files downloaded at once per node (1..64)",
        _int(1, 64),
    ),
    _entry(
        "model-store-download-bandwidth", "0",
        "download bytes per second per node, a quantity (0: unlimited)", _bytes_per_second,
    ),
    _entry(
        "model-prefetch-warmup-image", "gpustack/mirrored-python:3.12-alpine",
        "the image of ModelPrefetch warm-up Pods (needs sh, find and sha256sum)", _image,
    ),
    _entry(
        "model-store-peer-sync", "true",
        "nodes fetch a model from another node's model agent that holds it before the Hub (where "
        "the agents serve peers: model-manager --peer-port)", parsers.parse_bool,
    ),
    _entry(
        "workload-fit-affinity", "true",
        "pin admitted Kueue workloads to nodes whose free slices fit them", parsers.parse_bool,
    ),
    _entry(
        "node-management-manual", "false",
        "manage only nodes labelled gpustack.ai/managed=true by hand", parsers.parse_bool,
    ),
    _entry(
        "instance-type-mixed-on-node", "true", "allow several instance types on one node",
        parsers.parse_bool,
    ),
    _entry(
        "instance-type-derived-from-node", "true",
        "derive instance types from the nodes' detected devices", parsers.parse_bool,
    ),
    _entry(
        "instance-type-drain-when-no-flavors", "true",
        "drain an instance type whose flavors are all gone", parsers.parse_bool,
    ),
    _entry(
        "instance-type-aware-cpu-manufacturer", "false",
        "tell instance types apart by CPU manufacturer", parsers.parse_bool,
    ),
)  # fmt: skip

BY_NAME: Final[Mapping[str, Entry]] = {e.name: e for e in CATALOG}


class Values(msgspec.Struct, frozen=True, kw_only=True):
    """Every setting, typed: the one object reconcilers and webhooks read (swapped on change).

    No field has a default of its own: the catalog's text is the one default (:data:`DEFAULTS`
    is the catalog parsed)."""

    model_artifact_delivery_mode: str
    model_artifact_huggingface_endpoint: str
    model_artifact_modelscope_endpoint: str
    model_artifact_https_proxy: str
    model_artifact_no_proxy: str
    model_artifact_ca_bundle: str
    model_artifact_revalidate_interval: float
    model_store_high_watermark: int
    model_store_low_watermark: int
    model_store_download_concurrency: int
    model_store_download_bandwidth: int
    model_prefetch_warmup_image: str
    model_store_peer_sync: bool
    workload_fit_affinity: bool
    node_management_manual: bool
    instance_type_mixed_on_node: bool
    instance_type_derived_from_node: bool
    instance_type_drain_when_no_flavors: bool
    instance_type_aware_cpu_manufacturer: bool


def check(name: str, text: str) -> object:
    """The typed value of one setting's text.

    :raises InvalidSetting: unknown name, or the text breaks the entry's rules.
    """
    entry = BY_NAME.get(name)
    if entry is None:
        raise InvalidSetting(f"no setting {name!r} (the catalog is fixed)")
    try:
        return entry.convert(parsers.bounded(text))
    except (ValueError, ArithmeticError) as e:
        # A sensitive text (a proxy URL, perhaps with the very credentials refused) is never
        # repeated: this message reaches logs, exit lines and API clients.
        shown_text = MASK if entry.sensitive else repr(parsers.excerpt(text))
        raise InvalidSetting(f"setting {name} = {shown_text}: {e}") from None


def _cross_check(values: Values) -> None:
    if values.model_store_low_watermark >= values.model_store_high_watermark:
        raise InvalidSetting(
            f"model-store-low-watermark ({values.model_store_low_watermark}) must be below "
            f"model-store-high-watermark ({values.model_store_high_watermark})"
        )


def parse(data: Mapping[str, str]) -> tuple[Values, list[str]]:
    """``Values`` from stored texts, and the problems found (each falls back to its default).

    A missing key takes its default silently (backfill writes it); unknown keys are ignored.
    """
    typed: dict[str, object] = {}
    problems: list[str] = []
    for entry in CATALOG:
        text = data.get(entry.name, entry.default)
        try:
            typed[entry.field] = check(entry.name, text)
        except InvalidSetting as e:
            problems.append(f"{e}; using the default {entry.default!r}")
            typed[entry.field] = entry.convert(entry.default)
    values = Values(**typed)  # type: ignore[arg-type]
    try:
        _cross_check(values)
    except InvalidSetting as e:
        problems.append(f"{e}; using the default watermarks")
        values = msgspec.structs.replace(
            values,
            model_store_high_watermark=DEFAULTS.model_store_high_watermark,
            model_store_low_watermark=DEFAULTS.model_store_low_watermark,
        )
    return values, problems


def validate_all(data: Mapping[str, str]) -> Values:
    """Like :func:`parse`, but every problem is an error (seeds and API writes).

    :raises InvalidSetting: the first problem.
    """
    typed = {e.field: check(e.name, data.get(e.name, e.default)) for e in CATALOG}
    values = Values(**typed)  # type: ignore[arg-type]
    _cross_check(values)
    return values


DEFAULTS: Final[Values] = validate_all({})
"""Every setting at its catalog default."""


def seed(env: Mapping[str, str]) -> dict[str, str]:
    """Every setting's first text: ``GPUSTACK_<NAME>`` when set, else its default.

    :raises InvalidSetting: an environment value is invalid (the worker refuses to start).
    """
    data = {e.name: env.get(e.env, e.default) for e in CATALOG}
    validate_all(data)
    return data


def backfill(stored: Mapping[str, str], seeded: Mapping[str, str]) -> dict[str, str]:
    """What to add to the stored texts: the seeded ones it lacks. Never overwrites."""
    return {name: text for name, text in seeded.items() if name not in stored}


def shown(entry: Entry, text: str) -> str:
    """The text an API reader sees: the value, or :data:`MASK` for a sensitive one that is set."""
    return MASK if entry.sensitive and text else text


CHAIN_SETTINGS: Final = (
    "workload-fit-affinity",
    "node-management-manual",
    "instance-type-mixed-on-node",
    "instance-type-derived-from-node",
    "instance-type-drain-when-no-flavors",
    "instance-type-aware-cpu-manufacturer",
)
"""The settings the Kueue chain reads (docs/settings.md says "the Kueue chain" of exactly these)."""


def chain_fields(values: Values, *, manage_kueue: bool) -> dict[str, bool]:
    """The Kueue chain's settings by their struct field names (``manage_kueue`` comes from
    ``--disable-applications``, not from a setting)."""
    fields = {BY_NAME[name].field: getattr(values, BY_NAME[name].field) for name in CHAIN_SETTINGS}
    return {**fields, "manage_kueue": manage_kueue}
