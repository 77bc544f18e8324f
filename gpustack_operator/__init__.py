"""The ``gpustack-operator`` launcher: the command line, the process, and ``standalone``.

What lives here: the command table and Go-style flags (``commands``, ``flags``), klog-style
logging (``logs``), the entry point (``main``), the one process runner that owns the event loop,
signals and exit codes of every service (``process``), the bus tools (``buscli``,
``buswatching``, ``buswide`` for ``-o wide``, ``natsenv`` for the nats CLI's contexts), ``--help``
text (``helptext``) and shell completion (``completion``), the ``dashboard`` and ``standalone``, the one place that composes ``agent`` and ``controlplane``.
It sits above both and imports only the chosen command's modules.
"""
