"""chexnet_utils: the tested code behind the chexnet-at-scale notebooks.

Notebooks narrate; this package implements. Modules, one concern each:

- :mod:`chexnet_utils.labels`: the 14 pathologies, ``Finding Labels`` <-> multi-hot.
- :mod:`chexnet_utils.nih`: the NIH ChestX-ray14 layout (CSV, image folders, split lists,
  patient-level split, leakage check).
- :mod:`chexnet_utils.synthetic`: a synthetic stand-in written in the exact NIH layout.
- :mod:`chexnet_utils.config`: data location and the scale knob (``CHEXNET_SCALE``).
- :mod:`chexnet_utils.envcheck`: versions and Horovod build capabilities.
- :mod:`chexnet_utils.cli`: ``python -m chexnet_utils ...``.
"""

from chexnet_utils.labels import NO_FINDING, NUM_CLASSES, PATHOLOGIES

__all__ = ["PATHOLOGIES", "NUM_CLASSES", "NO_FINDING", "__version__"]
__version__ = "0.1.0"
