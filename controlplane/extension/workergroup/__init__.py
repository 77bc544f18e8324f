"""``worker.gpustack.ai/v1``: the public v1 views of the stored ``v1alpha1`` objects, served by
the worker from what it already holds (informers with a cluster, the bus ledger without one).

:mod:`.group` assembles and feeds it; :mod:`.providers` backs each resource; :mod:`.catalog`
declares what is served; :mod:`.progress` answers ``modelartifacts/<name>/progress``;
:mod:`.registration` is its APIService.
"""
