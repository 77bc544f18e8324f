"""Keep every resource server bound to its socket and registered with the current kubelet.

Level-based, so no event can be missed: each pass compares what should be (one socket per server
the node wants) with what is (our socket files, the identity of ``kubelet.sock``) and fixes the
difference. A pass runs on every :meth:`Registrar.wake` (a node update, or inotify seeing the
socket directory change) and every ``register_retry_s`` anyway.

A kubelet restart deletes every socket in the directory and creates a new ``kubelet.sock``: our
vanished sockets are bound again, and a ``kubelet.sock`` with a new inode or change time is a new
*generation* that every server registers with again. Register is retried while ``kubelet.sock``
is absent or refuses.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping

import anyio
from grpclib.client import Channel
from grpclib.exceptions import GRPCError, StreamTerminatedError

from agent.deviceplugin import inotify
from agent.deviceplugin.server import Key, ResourceServicer, SocketServer
from agent.deviceplugin.settings import DevicePluginSettings
from agent.grpcsocket import Identity, socket_identity
from proto.deviceplugin import v1beta1 as dp

log = logging.getLogger(__name__)

VERSION = "v1beta1"


class Registrar:
    """Owns the socket servers; run :meth:`run` in a task, its exit removes every socket."""

    def __init__(
        self,
        settings: DevicePluginSettings,
        desired: Callable[[], Mapping[Key, ResourceServicer]],
        *,
        ready: Callable[[], bool],
    ) -> None:
        self._settings = settings
        self._desired = desired
        self._ready = ready
        self._served: dict[Key, SocketServer] = {}
        self._registered: dict[Key, Identity] = {}
        """Per server, the kubelet.sock identity it last registered with."""
        self._wake = anyio.Event()
        self.registrations = 0
        self._kubelet_seen: bool | None = None
        """Whether ``kubelet.sock`` was there at the last pass (None before the first)."""

    def wake(self) -> None:
        self._wake.set()

    def registered(self) -> dict[Key, Identity]:
        return dict(self._registered)

    def connected(self) -> bool:
        """Every served resource is registered with the kubelet whose socket is there now.

        False while ``kubelet.sock`` is absent, so ``/readyz`` says what kubelet would see.
        """
        kubelet = socket_identity(self._settings.kube_socket)
        if kubelet is None:
            return False
        return all(self._registered.get(key) == kubelet for key in self._served)

    async def run(self) -> None:
        """Reconcile until cancelled; then close every server, shielded and time-bounded."""
        try:
            with inotify.watching(self._settings.socket_dir) as watch:
                async with anyio.create_task_group() as tg:
                    if watch is not None:
                        tg.start_soon(self._relay, watch, name="deviceplugin-inotify")
                    await self._reconcile_forever()
        finally:
            with anyio.move_on_after(self._settings.shutdown_timeout_s, shield=True):
                await self._stop_all()

    async def _relay(self, watch: inotify.DirectoryWatch) -> None:
        while True:
            await watch.changed()
            self.wake()

    async def _reconcile_forever(self) -> None:
        while True:
            if self._ready():
                await self.reconcile()
            with anyio.move_on_after(self._settings.register_retry_s):
                await self._wake.wait()
            self._wake = anyio.Event()

    async def reconcile(self) -> None:
        """One pass: stop unwanted servers, (re)bind missing sockets, register where needed."""
        desired = self._desired()
        for key in [k for k in self._served if k not in desired]:
            await self._stop(key)
        for key, servicer in desired.items():
            current = self._served.get(key)
            if current is not None and (current.servicer is not servicer or not current.intact()):
                log.info("%s: socket gone or servicer replaced; serving again", key)
                await self._stop(key)
                current = None
            if current is None:
                await self._start(key, servicer)
        kubelet = socket_identity(self._settings.kube_socket)
        self._note_kubelet(kubelet is not None)
        if kubelet is None:
            return
        for key, served in list(self._served.items()):
            if self._registered.get(key) != kubelet and await self._register(served):
                self._registered[key] = kubelet

    def _note_kubelet(self, present: bool) -> None:
        """Log when kubelet's socket appears or goes, once per change (not every pass)."""
        if present == self._kubelet_seen:
            return
        if not present:
            log.warning(
                "waiting for kubelet at %s (no socket there yet)", self._settings.kube_socket
            )
        elif self._kubelet_seen is False:
            log.info("kubelet is at %s; registering", self._settings.kube_socket)
        self._kubelet_seen = present

    async def _start(self, key: Key, servicer: ResourceServicer) -> None:
        path = os.path.join(self._settings.socket_dir, servicer.spec.socket_name)
        served = SocketServer(servicer, path, close_timeout_s=self._settings.shutdown_timeout_s)
        self._served[key] = served  # before binding, so a cancelled bind is still cleaned up
        await served.start()
        log.info("%s: serving on %s", servicer.spec.resource, path)

    async def _stop(self, key: Key) -> None:
        served = self._served.pop(key)
        self._registered.pop(key, None)
        await served.stop()

    async def _stop_all(self) -> None:
        for key in list(self._served):
            await self._stop(key)

    async def _register(self, served: SocketServer) -> bool:
        spec = served.servicer.spec
        request = dp.RegisterRequest(
            version=VERSION,
            endpoint=os.path.basename(served.path),
            resource_name=spec.resource,
            options=dp.DevicePluginOptions(get_preferred_allocation_available=True),
        )
        channel = Channel(path=self._settings.kube_socket)
        try:
            stub = dp.RegistrationStub(channel)
            await stub.register(request, timeout=self._settings.register_timeout_s)
        except (GRPCError, StreamTerminatedError, OSError, TimeoutError) as e:
            log.warning("%s: kubelet registration failed (retrying): %s", spec.resource, e)
            return False
        finally:
            channel.close()
        self.registrations += 1
        log.info("%s: registered with kubelet", spec.resource)
        return True
