"""Where agents, the control plane and dashboards meet: the event contract and its transport.

What lives here and nothing else: the subjects, the versioned event union (``events``) and its
codec, the wire shapes of devices and the records pushed to agents (``records``) with their
``bounds``, the NATS transport (``connection``, ``dialing`` and ``jetstream`` are the only ``nats``
importers), publishing (its ``outbox``, ``acking``), subscribing, retained state and key-value
buckets (``kv``), the embedded server, who may do what (``identity``, ``jwt`` for NKeys, the auth
``callout``, ``accessreviews`` for the agents' HTTPS endpoints), ``peers`` (the model agents'
peer offers and signed requests), ``presence`` (for ``/livez``),
``metrics``, the bus's settings and errors, and ``testing`` (real servers for tests only).
HTTP, YAML and the Hub live beside it (``kit``, ``hub``); the command-line tools live in the launcher.

Importing ``bus`` itself is cheap; the NATS client is imported only by the transport modules, so
one-shot commands can use the wire shapes without loading the service stacks.
"""
