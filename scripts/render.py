"""Render a kustomization under ``deploy/`` offline, the way ``kubectl kustomize`` would.

Why this exists: the manifests are a plain kustomize base with overlays, so a cluster admin uses
``kubectl apply -k``; but neither ``kubectl`` nor ``kustomize`` is available where the tests
run. This module implements exactly the subset of kustomize that ``deploy/`` uses and refuses
everything else, so the tests can never pass on a feature real kustomize would treat
differently:

- ``resources``: YAML files (one or more documents) or directories holding a
  ``kustomization.yaml``, relative to the kustomization;
- ``patches``: ``- path: file.yaml`` strategic-merge patches that name their target by
  ``apiVersion``, ``kind``, ``metadata.name`` (and ``metadata.namespace``); lists of containers,
  volumes, env, ports and volume mounts merge by their Kubernetes merge key, other lists
  replace, ``null`` deletes a key, ``$patch: delete`` deletes a list element;
- ``images``: ``name`` with ``newName`` and/or ``newTag``.

Output is deterministic: objects in kustomize's legacy kind order, then by namespace and name;
keys in source order. Invariant: rendering the same tree twice gives byte-identical text.

Usage: ``python scripts/render.py deploy`` or ``python scripts/render.py deploy/overlays/websocket``;
``python scripts/render.py lock`` prints the image's pinned runtime dependencies.
"""

from __future__ import annotations

import copy
import importlib.metadata
import re
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Final

import yaml

__all__ = ["RenderError", "build", "lock_lines", "render"]

Obj = dict[str, Any]

KUSTOMIZATION: Final = "kustomization.yaml"
_ALLOWED_FIELDS: Final = frozenset({"apiVersion", "kind", "resources", "patches", "images"})
_MERGE_KEYS: Final = {
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "volumes": "name",
    "env": "name",
    "ports": "containerPort",  # a Service's ports merge by "port" instead, see _merge_key
    "volumeMounts": "mountPath",
    "volumeDevices": "devicePath",
    "imagePullSecrets": "name",
}
# kustomize's "legacy" ordering: what must exist first comes first; webhooks come last.
_KIND_ORDER: Final = (
    "Namespace",
    "ResourceQuota",
    "StorageClass",
    "LimitRange",
    "PodSecurityPolicy",
    "PodDisruptionBudget",
    "ServiceAccount",
    "Secret",
    "SecretList",
    "ConfigMap",
    "PersistentVolume",
    "PersistentVolumeClaim",
    "CustomResourceDefinition",
    "ClusterRole",
    "ClusterRoleList",
    "ClusterRoleBinding",
    "ClusterRoleBindingList",
    "Role",
    "RoleList",
    "RoleBinding",
    "RoleBindingList",
    "Service",
    "DaemonSet",
    "Pod",
    "ReplicationController",
    "ReplicaSet",
    "Deployment",
    "HorizontalPodAutoscaler",
    "StatefulSet",
    "Job",
    "CronJob",
    "Ingress",
    "APIService",
)
_LAST_KINDS: Final = ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")


class RenderError(Exception):
    """The tree uses something this renderer does not implement, or is inconsistent."""


class _Dumper(yaml.SafeDumper):
    """Never writes anchors: a shared sub-tree is written out in full at every use."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def render(path: Path) -> str:
    """The kustomization at ``path`` as one multi-document YAML text."""
    return "".join(
        "---\n" + yaml.dump(d, Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=100)
        for d in build(path)
    )


def build(path: Path) -> list[Obj]:
    """The kustomization at ``path`` as a sorted list of objects (patched, images set).

    :raises RenderError: unknown fields, missing files, a patch without a target, duplicates.
    """
    objs = _load(path.resolve(), seen=())
    ids = [_identity(o) for o in objs]
    dupes = sorted({i for i in ids if ids.count(i) > 1})
    if dupes:
        raise RenderError(f"duplicate objects: {dupes}")
    return sorted(objs, key=_sort_key)


def _load(path: Path, seen: tuple[Path, ...]) -> list[Obj]:
    if path in seen:
        raise RenderError(f"kustomization cycle through {path}")
    kfile = path / KUSTOMIZATION
    if not kfile.is_file():
        raise RenderError(f"{path}: no {KUSTOMIZATION}")
    spec = _read_one(kfile)
    unknown = set(spec) - _ALLOWED_FIELDS
    if unknown:
        raise RenderError(f"{kfile}: fields not supported by this renderer: {sorted(unknown)}")
    objs: list[Obj] = []
    for entry in spec.get("resources") or []:
        target = path / str(entry)
        if target.is_dir():
            objs.extend(_load(target.resolve(), (*seen, path)))
        elif target.is_file():
            objs.extend(_read_all(target))
        else:
            raise RenderError(f"{kfile}: resource {entry!r} does not exist")
    for patch in spec.get("patches") or []:
        if set(patch) != {"path"}:
            raise RenderError(f"{kfile}: only '- path: file' patches are supported, got {patch}")
        for doc in _read_all(path / str(patch["path"])):
            _apply_patch(objs, doc, where=f"{kfile}: {patch['path']}")
    for image in spec.get("images") or []:
        _set_image(objs, image)
    return objs


def _read_all(file: Path) -> list[Obj]:
    try:
        docs = [d for d in yaml.safe_load_all(file.read_text()) if d is not None]
    except (OSError, yaml.YAMLError) as e:
        raise RenderError(f"{file}: {e}") from e
    for d in docs:
        if not isinstance(d, dict) or not {"apiVersion", "kind", "metadata"} <= set(d):
            raise RenderError(f"{file}: every document needs apiVersion, kind and metadata")
    return docs


def _read_one(file: Path) -> Obj:
    try:
        doc = yaml.safe_load(file.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise RenderError(f"{file}: {e}") from e
    if not isinstance(doc, dict):
        raise RenderError(f"{file}: not a mapping")
    return doc


def _identity(obj: Obj) -> tuple[str, str, str, str]:
    meta = obj["metadata"]
    return (obj["apiVersion"], obj["kind"], meta.get("namespace") or "", meta["name"])


def _sort_key(obj: Obj) -> tuple[int, str, str, str]:
    kind = obj["kind"]
    if kind in _KIND_ORDER:
        rank = _KIND_ORDER.index(kind)
    elif kind in _LAST_KINDS:
        rank = len(_KIND_ORDER) + 1 + _LAST_KINDS.index(kind)
    else:
        rank = len(_KIND_ORDER)
    _, _, ns, name = _identity(obj)
    return (rank, kind, ns, name)


def _apply_patch(objs: list[Obj], patch: Obj, *, where: str) -> None:
    wanted = _identity(patch)
    for i, obj in enumerate(objs):
        if _identity(obj) == wanted:
            objs[i] = merge(obj, patch)
            return
    raise RenderError(f"{where}: no object {wanted} to patch")


def merge(base: Any, patch: Any, field: str = "") -> Any:
    """Strategic merge of ``patch`` into ``base`` (neither is modified)."""
    if isinstance(base, dict) and isinstance(patch, dict):
        out = copy.deepcopy(base)
        for key, value in patch.items():
            if value is None:
                out.pop(key, None)
            elif key in out:
                out[key] = merge(out[key], value, key)
            else:
                out[key] = _strip_directives(copy.deepcopy(value))
        return out
    if isinstance(base, list) and isinstance(patch, list) and field in _MERGE_KEYS:
        return _merge_list(base, patch, _merge_key(field, patch))
    return _strip_directives(copy.deepcopy(patch))


def _merge_key(field: str, patch: list[Any]) -> str:
    if field == "ports" and all(isinstance(p, dict) and "containerPort" not in p for p in patch):
        return "port"
    return _MERGE_KEYS[field]


def _merge_list(base: list[Any], patch: list[Any], key: str) -> list[Any]:
    out = copy.deepcopy(base)
    for item in patch:
        if not isinstance(item, dict) or key not in item:
            raise RenderError(f"list element without merge key {key!r}: {item!r}")
        at = next((i for i, b in enumerate(out) if b.get(key) == item[key]), None)
        if item.get("$patch") == "delete":
            if at is not None:
                del out[at]
        elif at is None:
            out.append(_strip_directives(copy.deepcopy(item)))
        else:
            out[at] = merge(out[at], item)
    return out


def _strip_directives(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip_directives(v) for k, v in value.items() if not k.startswith("$patch")}
    if isinstance(value, list):
        return [_strip_directives(v) for v in value]
    return value


def _set_image(objs: list[Obj], image: Obj) -> None:
    name = image.get("name")
    if not name or not set(image) <= {"name", "newName", "newTag"}:
        raise RenderError(f"images: need name and only newName/newTag: {image}")
    for container in _containers(objs):
        ref = str(container.get("image", ""))
        repo, tag = _split_image(ref)
        if repo != name:
            continue
        repo = image.get("newName", repo)
        tag = image.get("newTag", tag)
        container["image"] = f"{repo}:{tag}" if tag else repo


def _split_image(ref: str) -> tuple[str, str]:
    match = re.fullmatch(r"(.+?)(?::([\w][\w.-]{0,127}))?", ref)
    if match is None:
        return ref, ""
    return match.group(1), match.group(2) or ""


def _containers(objs: Iterable[Obj]) -> Iterable[Obj]:
    for obj in objs:
        pod = obj.get("spec", {}).get("template", {}).get("spec", {})
        yield from pod.get("initContainers") or []
        yield from pod.get("containers") or []


def lock_lines(pyproject: Path = Path("pyproject.toml")) -> list[str]:
    """``name==version`` of every installed runtime dependency of the project, transitively.

    The roots are ``[project].dependencies`` of ``pyproject`` (not the installed metadata, which
    an editable install may have frozen before a dependency was added); the closure follows the
    installed distributions. Extras are not followed (the image installs none); environment
    markers are evaluated for this interpreter, so the lock is generated on Linux, Python 3.11.

    :raises RenderError: a dependency is not installed here.
    """
    import tomllib

    roots = tomllib.loads(pyproject.read_text())["project"]["dependencies"]
    pending = [_req_name(r) for r in roots if _applies(r)]
    found: dict[str, str] = {}
    while pending:
        name = _canonical(pending.pop())
        if name in found:
            continue
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError as e:
            raise RenderError(f"{name} is not installed; install the project first") from e
        found[name] = dist.version
        pending.extend(_req_name(r) for r in dist.requires or [] if _applies(r))
    return [f"{n}=={v}" for n, v in sorted(found.items())]


def _req_name(requirement: str) -> str:
    return re.split(r"[\s;\[<>=!~(]", requirement, maxsplit=1)[0]


def _applies(requirement: str) -> bool:
    from packaging.requirements import Requirement  # a pip dependency, always present

    marker = Requirement(requirement).marker
    return marker is None or marker.evaluate({"extra": ""})


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        sys.stderr.write("usage: render.py DIR | lock\n")
        return 2
    if argv[0] == "lock":
        header = "# The image's runtime dependencies, pinned: python scripts/render.py lock\n"
        sys.stdout.write(header + "".join(line + "\n" for line in lock_lines()))
        return 0
    try:
        sys.stdout.write(render(Path(argv[0])))
    except RenderError as e:
        sys.stderr.write(f"render: {e}\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
