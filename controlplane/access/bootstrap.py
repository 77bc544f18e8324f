"""The secrets the system needs, generated in the cluster at the worker's first start.

``kubectl apply -k deploy/base`` is the whole install: nobody generates keys on a laptop. The
bus's Secret (``gpustack-nats-auth``: the worker's NATS password and the auth callout's account
NKey, seed and public key) is created by the first worker replica that starts, with a create that
fails for every other (409), which then reads the winner's; a later start (a restart, another
replica, an upgrade) reads it and never regenerates a key that exists. A Secret missing some keys
(an install from before the callout) gets only the missing ones, under a ``resourceVersion``
precondition. The NATS pods wait for the Secret (kubelet retries their ``secretKeyRef``), the
worker reads it through the API, so nothing mounts it before it exists.

The webhook and extension API serving certificates are generated the same way
(:mod:`controlplane.admission.certificates`: the CA Secret ``gpustack-operator-worker-webhook-ca``).

:func:`missing` is the pure rule; :func:`ensure_bus_auth` the I/O.
"""

from __future__ import annotations

import base64
import logging
import secrets
import string
from typing import Final

import msgspec

from bus import jwt
from bus.errors import InvalidToken
from controlplane import errors
from controlplane.k8s.client import KubeClient
from controlplane.resources import SECRETS, Ref

__all__ = ["BusAuth", "BusAuthError", "ensure_bus_auth", "missing"]

log = logging.getLogger(__name__)

PASSWORD: Final = "worker-password"
SEED: Final = "callout-issuer-seed"
ISSUER: Final = "callout-issuer"
_ALPHABET: Final = string.ascii_letters + string.digits


class BusAuthError(errors.ControlPlaneError):
    """The Secret exists but holds an unusable key (not an account seed, or a public key that is
    not the seed's): the worker refuses to start rather than overwrite a key someone chose."""


class BusAuth(msgspec.Struct, frozen=True, kw_only=True):
    worker_password: str
    issuer_seed: str
    issuer: str


def _password() -> str:
    """32 letters and digits, never all digits (NATS would read such a value as a number)."""
    while True:
        text = "".join(secrets.choice(_ALPHABET) for _ in range(32))
        if not text.isdigit():
            return text


def missing(data: dict[str, str]) -> dict[str, str]:
    """The keys to add to the Secret's decoded ``data`` (empty: complete). Pure but for the
    random keys it generates. :raises BusAuthError: an existing key is unusable."""
    add: dict[str, str] = {}
    if not data.get(PASSWORD):
        add[PASSWORD] = _password()
    seed = data.get(SEED)
    if not seed:
        key = jwt.NKey.generate("account")
        add[SEED] = key.seed
        add[ISSUER] = key.public_key
        return add
    try:
        key = jwt.NKey(seed)
    except InvalidToken as e:
        raise BusAuthError(f"{SEED}: {e}") from e
    if key.kind != "account":
        raise BusAuthError(f"{SEED} is a {key.kind} seed; the callout issuer is an account (SA…)")
    if not data.get(ISSUER):
        add[ISSUER] = key.public_key
    elif data[ISSUER] != key.public_key:
        raise BusAuthError(f"{ISSUER} is not the public key of {SEED}")
    return add


def _decoded(secret: dict[str, object]) -> dict[str, str]:
    raw = secret.get("data") or {}
    assert isinstance(raw, dict)
    return {k: base64.b64decode(v).decode() for k, v in raw.items() if isinstance(v, str)}


def _encoded(data: dict[str, str]) -> dict[str, str]:
    return {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}


async def ensure_bus_auth(api: KubeClient, namespace: str, name: str) -> BusAuth:
    """The bus's Secret, created with fresh keys when absent, completed when partial."""
    ref = Ref(resource=SECRETS, name=name, namespace=namespace)
    for _ in range(5):
        try:
            secret = await api.get(ref)
        except errors.NotFound:
            body = {
                "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                "metadata": {"name": name, "namespace": namespace,
                             "labels": {"app.kubernetes.io/part-of": "gpustack-operator"}},
                "data": _encoded(missing({})),
            }  # fmt: skip
            try:
                await api.create(ref, body)
                log.info("generated the bus's keys: Secret %s/%s created", namespace, name)
            except errors.Conflict:
                pass  # another replica created it first: read theirs
            continue
        data = _decoded(secret)
        add = missing(data)
        if not add:
            return BusAuth(worker_password=data[PASSWORD], issuer_seed=data[SEED],
                           issuer=data[ISSUER])  # fmt: skip
        rv = secret["metadata"]["resourceVersion"]
        try:
            await api.patch(ref, {"metadata": {"resourceVersion": rv}, "data": _encoded(add)})
            log.info("completed Secret %s/%s with %s", namespace, name, ", ".join(sorted(add)))
        except errors.Conflict:
            continue
    raise errors.Conflict(409, f"Secret {namespace}/{name} kept changing while being completed")
