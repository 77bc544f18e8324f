"""Simulated accelerators, for machines without any: demos, tests and downstream CI.

Simulation happens at the vendor boundary, so the real backends run unchanged: NVIDIA through a
pynvml-compatible object (:mod:`.fakenvml`), AMD (and every card's PCI entry) through a sysfs tree
generated under a temporary host root (:mod:`.sysfs`). A profile (:mod:`.profiles`) describes the
cards. Everything detected this way is marked ``simulated: true`` on the wire.
"""
