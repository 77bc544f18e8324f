"""Simulated accelerators, for machines without any: demos, tests and downstream CI.

Simulation happens at the vendor boundary, so the real backends run unchanged: NVIDIA through a
pynvml-compatible object (:mod:`.fakenvml`), AMD (and every card's PCI entry) through a sysfs tree
generated under a temporary host root (:mod:`.sysfs`). A profile (:mod:`.profiles`) describes the
cards. Everything detected this way is marked ``simulated: true`` on the wire.

- profiles: :mod:`.profiles` (the YAML schema), :mod:`.builtin` (the packaged ones),
  :mod:`.load` (a card's load over time), :mod:`.sysfs`;
- NVIDIA: :mod:`.fakenvml` with :mod:`.fakemig`, :mod:`.fakegpm`, :mod:`.faketelemetry` and
  :mod:`.nvmlerrors`;
- the seven library-read manufacturers: :mod:`.libraries` (which stands in for which),
  :mod:`.fakelib` (what they share), :mod:`.layouts` (the output structures' sizes),
  :mod:`.fakedcmi`, :mod:`.fakecndev`, :mod:`.fakerocmsmi`, :mod:`.fakenvmlabi`,
  :mod:`.fakemxsml`, :mod:`.fakemtml`; :mod:`.moving` moves their cards with the seeded load
  pattern, as the NVIDIA ones move.
"""
