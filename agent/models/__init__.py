"""The model agent: a CSI node plugin serving verified Hugging Face snapshots from a node cache.

See docs/models.md for the volume contract, the on-disk layout and the bus reporting.

- the process: :mod:`.running` (composition root), :mod:`.settings`, :mod:`.server` (CSI
  Identity and Node on a unix socket), :mod:`.metrics`;
- volumes: :mod:`.volumes` (publish and unpublish), :mod:`.targets` (where a target path is),
  :mod:`.mounting` (bind mounts), :mod:`.policy`, :mod:`.kvpolicy` and :mod:`.policyfile` (who
  may mount what, from the bus, kept on disk);
- the cache: :mod:`.layout` (the on-disk layout), :mod:`.materializing` (a digest into a
  published tree, once: the job table), :mod:`.attempting` (one attempt's steps), :mod:`.jobs`
  (their records: sources, jobs, progress text), :mod:`.downloading`, :mod:`.assembling`,
  :mod:`.diskio` and :mod:`.publishing` (an attempt's steps), :mod:`.backoff`, :mod:`.collecting`
  (reclaiming space), :mod:`.reporting` (the cache as bus events), :mod:`.tuning` (its constants),
  :mod:`.errors`;
- peers: :mod:`.peering` (the live offers, this node's own), :mod:`.peerserver` (published
  trees served to signed requests), :mod:`.peerclient` (a peer's files behind the Hub client's
  interface);
- the one-shots: :mod:`.pull` (``model-manager pull``), :mod:`.manifest_cli`
  (``model-manager manifest``).
"""
