"""The C-library adapters: the one place each vendor management library is loaded and called.

Each returns plain Python values and raises the agent's error types; the vendor readers one
level up decide what the values mean. An import-linter contract names, for each adapter, the
readers and simulators that may import it.

- :mod:`.clib`: what the ctypes adapters share (loading, calling, mapping return codes);
- :mod:`.nvml` (through ``pynvml``), with :mod:`.nvmlcalls` (return codes and the binding) and
  :mod:`.nvmlmig` (MIG instances);
- :mod:`.nvmlabi`: the NVML-shaped C interface :mod:`.ixml` (Iluvatar) and :mod:`.hgml` (T-Head)
  re-implement;
- :mod:`.dcmi` (Ascend), :mod:`.cndev` (Cambricon), :mod:`.rocmsmi` and :mod:`.dmimig` (Hygon),
  :mod:`.mxsml` (MetaX), :mod:`.mtml` (Moore Threads).
"""
