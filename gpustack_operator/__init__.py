"""The ``gpustack-operator`` launcher: parses the command line and hands off to one command.

It sits above ``agent`` and ``controlplane`` and imports only the chosen command's module.
"""

__version__ = "0.1.0"
