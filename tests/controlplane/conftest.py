"""The control plane's tests, in folders that mirror ``controlplane/``'s packages.

The helpers they share stay here (``controlplane_fakeapi``, ``admission_helpers``,
``fakegpustack``, ``kueue_schemas``, the ``controlplane_detect_*.json`` fixtures, read from
``Path(__file__).parents[1]``). pytest puts this folder on ``sys.path`` when it loads this
conftest; the folders below are put there too, because some tests import others by their bare
module name (``from test_controlplane_worker import worker_settings``), which worked while they
all sat in one folder. Test module names stay unique across the tree, so nothing is shadowed.
"""

from __future__ import annotations

import sys
from pathlib import Path

for _folder in sorted(p for p in Path(__file__).parent.iterdir() if p.is_dir()):
    if _folder.name != "__pycache__" and str(_folder) not in sys.path:
        sys.path.append(str(_folder))
