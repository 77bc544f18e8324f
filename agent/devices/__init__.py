"""Accelerator detection and monitoring: vendor readers over their C-library adapters.

Everything here is synchronous and side-effect free on the host (pure reads): the one-shot
commands call it directly, the device agent calls a whole pass through ``anyio.to_thread``.

- vendor readers, one per manufacturer: :mod:`.nvidia` (with :mod:`.nvidia_facts` and
  :mod:`.gpm`), :mod:`.amd` (sysfs, with :mod:`.amdgpu_ids`), and the seven read through a
  vendor library: :mod:`.ascend`, :mod:`.cambricon`, :mod:`.hygon`, :mod:`.iluvatar`,
  :mod:`.metax`, :mod:`.mthreads`, :mod:`.thead`, on the shared backend :mod:`.vendor` (and
  :mod:`.clones` for the two NVML clones);
- :mod:`.libs`: the C-library adapters, the only modules that load a vendor library; a reader
  imports its own adapters, an adapter never imports a reader;
- what every pass shares: :mod:`.detection` (a pass over backends), :mod:`.sources` (real
  hardware under a host root, or a simulated profile), :mod:`.settings` (detection's settings),
  :mod:`.manufacturers`, :mod:`.pci`, :mod:`.hostfs`;
- :mod:`.simulation`: simulated hardware (profiles, sysfs trees, fake libraries), loaded only
  when ``--simulate`` asks for it.
"""
