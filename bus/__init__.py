"""Where agents, the control plane and dashboards meet: the event contract and its transport.

What lives here and nothing else: the subjects, the versioned event union and its codec, the
wire shapes of devices and the records pushed to agents (``records``), the NATS transport
(``connection``, ``dialing`` and ``jetstream`` are the only ``nats`` importers), publishing, subscribing,
retained state and key-value buckets, the embedded server, and the bus's settings and errors. HTTP, YAML and the
Hub live beside it (``kit``, ``hub``); the command-line tools live in the launcher.

Importing ``bus`` itself is cheap; the NATS client is imported only by the transport modules, so
one-shot commands can use the wire shapes without loading the service stacks.
"""
