"""AdmissionReview ``admission.k8s.io/v1`` in and out: decoding a request, encoding the answer.

What the API server checks in an answer: ``apiVersion``/``kind`` of the review, ``response.uid``
equal to the request's, ``patch`` and ``patchType: JSONPatch`` together (the patch base64 in
JSON, as msgspec encodes ``bytes``). A refusal carries a ``status`` whose message the user sees
after ``admission webhook "<name>" denied the request:``.

A body that is no AdmissionReview v1 (not JSON, another version, no ``request``, an object that is
no Pod) is the caller's mistake: :class:`BadReview`, answered 400, never an exception. So is a
review whose object is not the resource it names (:func:`check_object`: a ConfigMap sent as the
object of a Pod review), whatever the operation. A review of anything but a Pod CREATE (the
configurations send none) is otherwise allowed untouched.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final, cast

import msgspec

from controlplane.admission.pods import PatchOp, Pod

__all__ = [
    "API_VERSION",
    "BadReview",
    "Decision",
    "Request",
    "answer",
    "answered",
    "check_object",
    "decode",
    "refusal",
    "request_of",
]

API_VERSION: Final = "admission.k8s.io/v1"
_MAX_MESSAGE: Final = 4096
"""A refusal's message is cut here: the client shows it whole, and a Pod can break many rules."""


class BadReview(ValueError):
    """The body is no AdmissionReview this webhook can answer."""


class _Camel(msgspec.Struct, kw_only=True, rename="camel", omit_defaults=True):
    pass


class Kind(_Camel, kw_only=True):
    group: str = ""
    version: str = ""
    kind: str = ""


class Resource(_Camel, kw_only=True):
    group: str = ""
    version: str = ""
    resource: str = ""


class User(_Camel, kw_only=True):
    username: str = ""


class Request(_Camel, kw_only=True):
    uid: str
    kind: Kind = msgspec.field(default_factory=Kind)
    resource: Resource = msgspec.field(default_factory=Resource)
    operation: str = ""
    namespace: str = ""
    name: str = ""
    sub_resource: str = ""
    user_info: User = msgspec.field(default_factory=User)
    object: msgspec.Raw = msgspec.Raw(b"null")
    old_object: msgspec.Raw = msgspec.Raw(b"null")
    dry_run: bool = False


class _TypeMeta(msgspec.Struct, kw_only=True, rename="camel"):
    api_version: str = ""
    kind: str = ""


class _Review(_Camel, kw_only=True):
    api_version: str
    kind: str
    request: Request | None = None


class Status(_Camel, kw_only=True):
    code: int
    reason: str
    message: str
    status: str = "Failure"


class Response(_Camel, kw_only=True):
    uid: str
    allowed: bool
    status: Status | None = None
    patch: bytes | None = None
    patch_type: str | None = None


class _Answer(msgspec.Struct, kw_only=True, rename="camel"):
    """Written whole: the API server checks ``apiVersion`` and ``kind`` of every answer."""

    api_version: str = API_VERSION
    kind: str = "AdmissionReview"
    response: Response


class Decision(msgspec.Struct, frozen=True, kw_only=True):
    """What a webhook decided for one Pod: a patch (mutating) or the rules it breaks."""

    patch: list[PatchOp] = []
    errors: list[str] = []


_REVIEW = msgspec.json.Decoder(_Review)
_TYPE_META = msgspec.json.Decoder(_TypeMeta)
_POD = msgspec.json.Decoder(Pod)
_ENCODER = msgspec.json.Encoder()


def check_object(request: Request) -> None:
    """Refuse an object whose ``kind``/``apiVersion`` are not the resource ``request.kind`` names.

    The API server always writes both into the object it sends; a review whose object says
    another kind (or another group/version) was not made by it, and answering it as if it were
    would decide on the wrong thing. A member left out on either side is not checked (a
    hand-written review may omit them), nor is a subresource's object (``pods/eviction`` sends an Eviction), nor an object
    that is no JSON object (the kind's own decoder judges that).

    :raises BadReview: the object names another kind or group/version.
    """
    if request.sub_resource:
        return
    try:
        meta = _TYPE_META.decode(request.object)
    except msgspec.DecodeError:
        return
    named = request.kind
    expected = f"{named.group}/{named.version}" if named.group else named.version
    if meta.kind and named.kind and meta.kind != named.kind:
        raise BadReview(f"request.object is a {meta.kind}, not the {named.kind} the review names")
    if meta.api_version and named.version and meta.api_version != expected:
        raise BadReview(
            f"request.object is {meta.api_version}, not the {expected} the review names"
        )


def request_of(body: bytes) -> Request:
    """The request of an AdmissionReview ``admission.k8s.io/v1`` about any resource, its
    object checked against the kind it names (:func:`check_object`); every webhook of the
    worker reads its reviews through here.

    :raises BadReview: not such a review, or one with no request uid.
    """
    try:
        review = _REVIEW.decode(body)
    except msgspec.DecodeError as e:
        raise BadReview(f"not an AdmissionReview: {e}") from e
    if review.api_version != API_VERSION or review.kind != "AdmissionReview":
        raise BadReview(
            f"expected AdmissionReview {API_VERSION}, got {review.kind} {review.api_version}"
        )
    request = review.request
    if request is None or not request.uid:
        raise BadReview("the AdmissionReview carries no request with a uid")
    check_object(request)
    return request


def refusal(code: int, reason: str, errors: list[str]) -> Status:
    """The status of a refused request: one error as is, several as ``[a, b]``, cut at
    :data:`_MAX_MESSAGE` characters."""
    message = errors[0] if len(errors) == 1 else f"[{', '.join(errors)}]"
    if len(message) > _MAX_MESSAGE:
        message = message[: _MAX_MESSAGE - 1] + "…"
    return Status(code=code, reason=reason, message=message)


def answered(response: Response) -> dict[str, Any]:
    """The whole AdmissionReview answer carrying ``response``, as JSON-ready data."""
    return cast(dict[str, Any], msgspec.to_builtins(_Answer(response=response)))


def decode(body: bytes) -> tuple[Request, Pod | None]:
    """The request and, for a Pod CREATE, the Pod; ``None`` for anything else.

    :raises BadReview: see :func:`request_of`; a Pod CREATE whose object is no Pod.
    """
    request = request_of(body)
    if (request.kind.group, request.kind.kind, request.operation) != ("", "Pod", "CREATE"):
        return request, None
    if request.sub_resource:
        return request, None
    try:
        return request, _POD.decode(request.object)
    except msgspec.DecodeError as e:
        raise BadReview(f"request.object is not a Pod: {e}") from e


def answer(body: bytes, decide: Callable[[Pod], Decision]) -> bytes:
    """The AdmissionReview answering ``body``. :raises BadReview: see :func:`decode`."""
    request, pod = decode(body)
    decision = Decision() if pod is None else decide(pod)
    response = Response(uid=request.uid, allowed=not decision.errors)
    if decision.errors:
        response.status = refusal(422, "Invalid", decision.errors)
    elif decision.patch:
        response.patch = _ENCODER.encode(decision.patch)
        response.patch_type = "JSONPatch"
    return _ENCODER.encode(_Answer(response=response))
