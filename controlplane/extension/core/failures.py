"""Failures as kube-apiserver words them: one exception, one ``metav1.Status`` document.

Every decision of the core raises :class:`ApiFailure`; the HTTP layer turns it into the Status
with its code. ``details`` names the object (``name``, ``group``, ``kind`` = the resource's
plural, as kube-apiserver's ``NewNotFound``/``NewConflict`` do) so clients such as
``kubectl`` and client-go can tell which object a 404 or 409 is about.
"""

from __future__ import annotations

from typing import Any

__all__ = ["ApiFailure", "bad_request", "conflict", "expired", "invalid", "not_found", "status"]


class ApiFailure(Exception):
    """A request the API refuses: HTTP ``code``, Status ``reason``, one-line ``message``."""

    def __init__(
        self, code: int, reason: str, message: str, *, details: dict[str, Any] | None = None
    ) -> None:
        super().__init__(message)
        self.code, self.reason, self.details = code, reason, details

    def status(self) -> dict[str, Any]:
        return status(self.code, self.reason, str(self), details=self.details)


def status(
    code: int, reason: str, message: str, *, details: dict[str, Any] | None = None
) -> dict[str, Any]:
    """A failed ``metav1.Status``."""
    out: dict[str, Any] = {"kind": "Status", "apiVersion": "v1", "metadata": {},
                           "status": "Failure", "message": message, "reason": reason,
                           "code": code}  # fmt: skip
    if details:
        out["details"] = details
    return out


def _details(group: str, resource: str, name: str) -> dict[str, Any]:
    return {"name": name, "group": group, "kind": resource} if name else {
        "group": group, "kind": resource}  # fmt: skip


def _qualified(group: str, resource: str) -> str:
    return f"{resource}.{group}" if group else resource


def not_found(group: str, resource: str, name: str) -> ApiFailure:
    return ApiFailure(404, "NotFound", f'{_qualified(group, resource)} "{name}" not found',
                      details=_details(group, resource, name))  # fmt: skip


def conflict(group: str, resource: str, name: str, why: str) -> ApiFailure:
    text = f'Operation cannot be fulfilled on {_qualified(group, resource)} "{name}": {why}'
    return ApiFailure(409, "Conflict", text, details=_details(group, resource, name))


def invalid(group: str, kind: str, name: str, causes: list[tuple[str, str]]) -> ApiFailure:
    """422: ``causes`` are (field, message) pairs."""
    text = "; ".join(f"{f}: {m}" if f else m for f, m in causes)
    details = {"name": name, "group": group, "kind": kind,
               "causes": [{"reason": "FieldValueInvalid", "message": m, "field": f}
                          for f, m in causes]}  # fmt: skip
    return ApiFailure(422, "Invalid", f'{kind}.{group} "{name}" is invalid: {text}',
                      details=details)  # fmt: skip


def bad_request(message: str) -> ApiFailure:
    return ApiFailure(400, "BadRequest", message)


def expired(message: str) -> ApiFailure:
    """410 Gone: a resourceVersion or continue token older than what is kept."""
    return ApiFailure(410, "Expired", message)
