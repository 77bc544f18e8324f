"""The ``worker`` process: what composes the control plane's parts into one service.

- :mod:`.running`: the composition root (:func:`running.run`): what every replica and the
  leader run;
- :mod:`.assembling`: how its parts are built and connected (:func:`assembling.assemble`);
- :mod:`.settings`: its frozen settings, built from flags and the environment;
- :mod:`.endpoint`: its HTTPS endpoint (metrics, probes, webhooks, guards, extension API);
- :mod:`.leading`: leader election on a Lease (one active replica).
"""
