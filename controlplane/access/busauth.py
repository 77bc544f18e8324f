"""Who is connecting to the bus, proven by Kubernetes: the worker's side of the auth callout.

An agent connects with its projected ServiceAccount token (audience :attr:`BusAuthSettings.
audience`, kubelet rotates it). The worker asks the API server about it (TokenReview) and maps
the answer to a :class:`bus.identity.Identity` with :func:`identity_from_review`:

- the token must be authenticated for our audience, for a ServiceAccount of our namespace;
- the ServiceAccount names the role (:data:`ROLES_BY_SERVICE_ACCOUNT`);
- an agent's node is the ``authentication.kubernetes.io/node-name`` the API server put into
  the token when kubelet requested it for the agent's Pod (NodeRestriction lets a kubelet ask
  only for Pods bound to its own node), never anything the agent says; a token that is not
  bound to a Pod on a node proves no agent.

TokenReview also fails once the Pod is gone or the token expired, so a stolen token opens no
connection after its Pod is deleted (an established connection is verified again at its next
reconnect, see :mod:`bus.callout`). What is not even shaped like an unexpired ServiceAccount
token is refused without asking the API server (:func:`token_expiry`), so garbage from
anonymous clients costs no API request.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import time
from typing import Any, Final

import msgspec

from bus import callout, jwt
from bus.errors import InvalidNodeName, InvalidToken
from bus.identity import Identity, Role
from controlplane import errors
from controlplane.k8s.client import KubeClient
from kit.files import InputRefused, read_capped

__all__ = [
    "ROLES_BY_SERVICE_ACCOUNT",
    "TOKENREVIEWS",
    "BusAuthSettings",
    "identity_from_review",
    "issuer",
    "load_issuer",
    "review_verifier",
    "token_expiry",
]

log = logging.getLogger(__name__)

TOKENREVIEWS: Final = "/apis/authentication.k8s.io/v1/tokenreviews"
ROLES_BY_SERVICE_ACCOUNT: Final[dict[str, Role]] = {
    "gpustack-operator-device-manager": "device-manager",
    "gpustack-operator-model-manager": "model-manager",
    "gpustack-operator-dashboard": "dashboard",
}
_EXTRA: Final = "authentication.kubernetes.io/"
DEFAULT_AUDIENCE: Final = "gpustack-nats"


class BusAuthSettings(msgspec.Struct, frozen=True, kw_only=True):
    """The worker serves the bus's auth callout when this is set."""

    issuer_seed_file: str = ""
    """The file of the account NKey seed (``SA…``) whose public key the servers'
    ``auth_callout.issuer`` names: it signs every user JWT."""
    issuer_seed: str = ""
    """That seed itself, read from the bus's Secret at start (:mod:`controlplane.access.bootstrap`);
    when set, the file is not read."""
    audience: str = DEFAULT_AUDIENCE
    """The audience agents' projected tokens are requested for (never the API server's)."""
    namespace: str = "gpustack-system"
    """Only ServiceAccounts of this namespace (the operator's) prove an identity."""


SEED_BYTES: Final = 4096
"""More than any seed file holds (a seed is 58 characters, perhaps with comments)."""


def issuer(settings: BusAuthSettings) -> jwt.NKey:
    """The issuer's key: the seed read from the Secret, else the seed file's."""
    if settings.issuer_seed:
        return jwt.NKey(settings.issuer_seed)
    return load_issuer(settings.issuer_seed_file)


def load_issuer(path: str) -> jwt.NKey:
    """The issuer's account key from its seed file.

    :raises bus.errors.InvalidToken: not an account seed, or no regular file of a seed's size.
    """
    try:  # a seed is 58 characters: never read /dev/zero or a file of gigabytes whole
        text = read_capped(path, limit=SEED_BYTES).decode("ascii", errors="replace")
    except InputRefused as e:
        raise InvalidToken(str(e)) from e
    try:
        key = jwt.NKey(text)
    except InvalidToken as e:
        raise InvalidToken(f"{path}: {e}") from e
    if key.kind != "account":
        raise InvalidToken(f"{path}: a {key.kind} seed; the callout issuer is an account (SA…)")
    return key


def identity_from_review(review: dict[str, Any], settings: BusAuthSettings) -> Identity:
    """The identity a TokenReview's answer proves (pure).

    :raises bus.callout.Refused: not authenticated, another audience or namespace, a
        ServiceAccount with no role, or an agent's token not bound to a Pod on a node.
    """
    status = review.get("status") or {}
    if status.get("authenticated") is not True:
        raise callout.Refused(f"token not authenticated: {status.get('error') or 'no reason'}")
    if settings.audience not in (status.get("audiences") or []):
        raise callout.Refused(f"token not for the audience {settings.audience!r}")
    user = status.get("user") or {}
    username = str(user.get("username") or "")
    namespace, _, account = username.removeprefix("system:serviceaccount:").partition(":")
    if not username.startswith("system:serviceaccount:") or namespace != settings.namespace:
        raise callout.Refused(f"{username!r} is not a ServiceAccount of {settings.namespace}")
    role = ROLES_BY_SERVICE_ACCOUNT.get(account)
    if role is None:
        raise callout.Refused(f"{username!r} has no role on the bus")
    if role == "dashboard":
        return Identity(role=role, name=username)
    extra = user.get("extra") or {}
    node, pod = _first(extra, "node-name"), _first(extra, "pod-name")
    if node is None or pod is None:
        raise callout.Refused(f"{username!r}: the token is not bound to a Pod on a node")
    try:
        return Identity(role=role, node=node, name=f"{username} pod {pod}")
    except InvalidNodeName as e:
        raise callout.Refused(f"{username!r}: node {node!r}: {e}") from e


def _first(extra: dict[str, Any], key: str) -> str | None:
    values = extra.get(_EXTRA + key) or []
    return values[0] if isinstance(values, list) and values and values[0] else None


def token_expiry(token: str) -> float | None:
    """The ``exp`` of a JWT's claims, read without verifying (TokenReview verified it)."""
    parts = token.split(".")
    if len(parts) != 3:
        return None
    try:
        claims = json.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))
    except (ValueError, binascii.Error):
        return None
    exp = claims.get("exp") if isinstance(claims, dict) else None
    return float(exp) if isinstance(exp, int | float) else None


def review_verifier(api: KubeClient, settings: BusAuthSettings) -> callout.Verifier:
    """A verifier asking the API server about each token (POST ``tokenreviews``)."""

    async def verify(credentials: callout.Credentials) -> callout.Grant:
        if not credentials.token:
            raise callout.Refused("no token (connect with a projected ServiceAccount token)")
        expiry = token_expiry(credentials.token)
        if expiry is None or expiry <= time.time():
            raise callout.Refused("not an unexpired ServiceAccount token")
        body = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenReview",
            "spec": {"token": credentials.token, "audiences": [settings.audience]},
        }
        try:
            review = await api.request("POST", TOKENREVIEWS, body)
        except errors.ControlPlaneError as e:
            raise callout.Refused(f"TokenReview failed: {e}") from e
        return callout.Grant(identity=identity_from_review(review, settings))

    return verify
