"""RayApp: the server with its model workers on a Ray cluster (``modelyard serve --ray``).

The same :class:`~modelyard.app.App` (front ends, data plane, manager, schedulers);
what changes is where replicas run and which devices the manager budgets: the host's
``devices:`` are replaced by every node's ``NODE/cpu`` and ``NODE/cuda:N`` (read from
the cluster and kept current by :class:`~modelyard.manager.cluster.ClusterDevices`),
and each replica of a model with ``isolation: process`` is a Ray actor
(:class:`~modelyard.workers.ray_instance.RayInstance`). Inline models stay in this
process. Ray is imported only here and in the ``workers/ray_*`` modules.
"""

from __future__ import annotations

import asyncio

from modelyard.app import App, StartupError
from modelyard.clock import Clock
from modelyard.config.model_config import ModelConfig
from modelyard.config.ray import RayConfig
from modelyard.config.settings import ServerSettings
from modelyard.errors import ModelNotReadyError
from modelyard.manager.cluster import ClusterDevices
from modelyard.workers.instance import ModelInstance

__all__ = ["RayApp", "make_app"]


def make_app(settings: ServerSettings, *, clock: Clock | None = None) -> App:
    """The server ``settings`` ask for: on a Ray cluster when ``ray:`` is set."""
    if settings.ray is not None:
        return RayApp(settings, clock=clock)
    return App(settings, clock=clock)


class RayApp(App):
    """A server whose model workers are Ray actors on the cluster's nodes."""

    def __init__(self, settings: ServerSettings, *, clock: Clock | None = None) -> None:
        super().__init__(settings, clock=clock)
        self.ray_config: RayConfig = settings.ray or RayConfig()
        # The cluster's nodes are the devices; none is known before the cluster is read.
        self.manager.devices.clear()
        self.manager.budget.devices.clear()
        self.cluster_devices: ClusterDevices | None = None
        self._cluster: object = None

    def _make_instance(self, config: ModelConfig) -> ModelInstance:
        if config.isolation == "inline":
            return super()._make_instance(config)
        from modelyard.workers.ray_instance import RayInstance

        if self._cluster is None:
            raise ModelNotReadyError("the Ray cluster is not connected (server stopping)")
        from modelyard.workers.ray_cluster import RayCluster

        assert isinstance(self._cluster, RayCluster)
        return RayInstance(
            self._cluster,
            public_keys=list(self.settings.manifest_public_keys),
            require_manifest=self.settings.require_manifest,
            load_timeout_s=config.load_timeout_s,
            repository_root=self.settings.repository_root,
        )

    async def start(self) -> None:
        """Join the cluster, read its nodes as devices, watch them, then start as usual."""
        try:
            from modelyard.workers.ray_cluster import RayCluster
        except ImportError as exc:
            raise StartupError(
                f"ray mode needs the 'ray' extra (pip install 'modelyard[ray]'): {exc}"
            ) from None
        cluster = RayCluster(self.ray_config)
        try:
            await asyncio.to_thread(cluster.connect)
        except Exception as exc:
            raise StartupError(
                f"cannot join the Ray cluster at {self.ray_config.address}: {exc}"
            ) from None
        self._cluster = cluster
        watcher = ClusterDevices(
            self.manager.devices,
            self.manager.budget,
            self.manager.events,
            cluster.read_nodes,
            cluster.fail_node,
            self.ray_config.poll_interval_s,
        )
        self.cluster_devices = watcher
        self.manager.on_restart_failed(watcher.refresh)
        await watcher.refresh()
        watcher.start()
        try:
            await super().start()
        except BaseException:
            await self._leave()
            raise

    async def stop(self) -> None:
        """Stop as usual (every actor of this server stops), then leave the cluster."""
        await super().stop()
        await self._leave()

    async def _leave(self) -> None:
        if self.cluster_devices is not None:
            await self.cluster_devices.close()
        cluster, self._cluster = self._cluster, None
        if cluster is not None:
            from modelyard.workers.ray_cluster import RayCluster

            assert isinstance(cluster, RayCluster)
            await asyncio.to_thread(cluster.close)
