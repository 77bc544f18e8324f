"""The kubelet device-plugin side of ``dm serve``.

Pure decisions live in :mod:`resources` (which servers and tokens exist), :mod:`holdings` (who holds
what share of which card), :mod:`allocation` (Allocate and GetPreferredAllocation) and
:mod:`responders` (what each vendor's runtime needs injected, as the plain data of
:mod:`injection`, which one-shots such as ``dm preflight`` import without grpclib; NVIDIA and AMD
there, the seven others in :mod:`vendors`, their shared caps and HAMi-core in :mod:`slicing`). The async
layer only does I/O: :mod:`server` serves one resource on its socket (its hot replies written to
the wire by :mod:`encoding`, which also turns an injection into kubelet's message),
:mod:`partitions` decides MIG profiles, placements and reclaim (pure) and :mod:`partitioning`
creates and destroys the instances through NVML in worker threads (:mod:`instances` finds or
creates the one a partitioned Allocate gets, after waiting for its claim), :mod:`registration` keeps every server registered with kubelet across kubelet restarts,
:mod:`podresources` asks kubelet who holds which device, and :mod:`running` wires them into one
async context manager, :func:`running.device_plugins`. :mod:`kvpending` follows the node's pending
sliced and partitioned containers from the bus; :mod:`pending` picks the one an Allocate serves.
:mod:`node` keeps the node's ledger and its transactions on the event loop, wiring two parts:
:mod:`offers` (the cards, each resource's servicer and view, re-keying only changed token lists)
and :mod:`injecting` (what a grant injects, the CDI catalog, and its host side before Allocate
answers: driver steps, and through :mod:`workdirs` its work directories and their files). Which
pending container each grant serves is :mod:`claims` (``reserve``/``release``, and the
change-woken wait of a partitioned Allocate).
Also: :mod:`settings` (built at the edge), :mod:`limits` (bounds on a kubelet request),
:mod:`errors` (named for the gRPC status kubelet sees), :mod:`cdi` (NVIDIA's device channel),
:mod:`mirroring` (a visibility sidecar sees what its Pod's owner holds), :mod:`inotify` (waking on
kubelet's socket directory), :mod:`controls` (the driver controls ``dm serve`` registers).
"""
