"""The Kubernetes API, as the control plane reaches it.

- :mod:`.client`: the adapter, the only module that imports ``kubernetes_asyncio``;
- :mod:`.informing`: informers (a collection kept in memory by a list and a watch);
- :mod:`.limiting`: the client-side rate limit (a token bucket).
"""
