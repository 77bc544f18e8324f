"""The control plane: the only part of the system that speaks to the Kubernetes API.

It subscribes to the bus and reconciles node events into CRDs. It never imports ``agent``.

What lives here, top to bottom (the import contracts in ``pyproject.toml`` keep this order; a
package imports only those below it):

- :mod:`.worker`: the ``worker`` process: composition root, settings, HTTPS endpoint, leader
  election;
- :mod:`.extension`: the aggregated extension API (``gpustack.ai/v1``) on its API-serving core;
- :mod:`.applications`: the applications the leader installs; :mod:`.schema`: our CRDs and what
  ``kubectl explain`` says about them;
- :mod:`.chain`: the scheduling chain (InstanceTypes, Kueue objects, the admission check);
- :mod:`.admission`: the Pod webhooks and the fractional request model; :mod:`.gateway`: the
  worker-gateway process; :mod:`.stores`: the ModelStore pool and each node's store spec,
  ModelStoreBinding and ModelPrefetch decisions; :mod:`.delivery`: the leader's loops that
  meter bindings and carry out prefetches;
- :mod:`.reconciling`: bus events folded into node state, and the reconcilers that write it;
  :mod:`.access`: who may connect (the bus auth callout, token and access reviews, the secrets
  made at first start); :mod:`.clustersettings`: the ``Setting`` catalog and where settings live;
- :mod:`.k8s`: the Kubernetes API adapter (the only ``kubernetes_asyncio`` importer), informers;
- shared below everything: :mod:`.resources` (the API resources and object references),
  :mod:`.families` (the accelerator resource vocabulary), :mod:`.errors`, :mod:`.metrics`.
"""
