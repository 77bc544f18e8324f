"""Wire types generated from public protocol definitions (kubelet device plugin, CSI).

The lowest layer: nothing here imports anything of ours. Generated modules are committed and
checked for drift by ``just check``.
"""
