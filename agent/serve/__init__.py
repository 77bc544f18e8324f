"""``dm serve``: the device agent, composed from detection, the device plugins and the bus.

- :mod:`.settings`: its frozen settings, built from flags at the edge;
- :mod:`.running`: the composition root (:func:`running.run`), one async context manager per
  long-lived part;
- :mod:`.observing`: the detection and monitor loop, publishing what it finds;
- :mod:`.watching`: the kernel's Xid and health events, followed;
- :mod:`.health`: which cards are healthy, decided from those events (pure);
- :mod:`.metrics`: the Prometheus series (DCGM's names and labels);
- :mod:`.restoring`: the device plugins' ledger rebuilt after a restart from the bus;
- :mod:`.holdingsfile`: that ledger's holdings kept on the node, for a start without the bus.
"""
