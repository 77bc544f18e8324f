"""``dm preflight``: prove on a real node that the allocation modes work, measured where possible.

The pass is planned before anything acts: :mod:`kubeletconfig` reads which container runtime the
kubelet uses (pure reads of the host root), :mod:`injection` asks the device plugin's own
responders what a sliced or visibility container receives, :mod:`checking` turns detection and
injections into the capability rows to establish (per manufacturer as :mod:`vendors` says, with
the driver reads of :mod:`declaring`) and judges probe output, :mod:`invocations` renders the
exact runtime argument vectors, :mod:`staging` writes the preload tree and holds the lock,
:mod:`host` runs commands through ``chroot <host-root>``, and :mod:`running` wires them into the
one-shot command. :mod:`model` is the printed document, :mod:`judging` turns probe output into
its rows, and :mod:`settings` are the command's settings.
"""
