"""Where agents, the control plane and dashboards meet: the event contract and its transport.

Importing ``bus`` itself is cheap; the NATS client is imported only by the transport modules, so
one-shot commands can use the wire shapes without loading the service stacks.
"""
