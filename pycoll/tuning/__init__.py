"""Tuning: the α-β cost model of pycoll's plans (``model``), its link and device parameters (``links``),
a calibration saved and loaded (``persist``: what the core may load), and the calibration itself on the
current machine (``calibrate``: measuring and fitting, on top of the core, which never imports it).
``algorithm="auto"`` and ``compression="auto"`` choose by the model."""

from pycoll.tuning.links import DEVICES, LINKS, DeviceProfile, LinkProfile, link_named
from pycoll.tuning.model import Model, Prediction, expected_error

__all__ = [
    "DEVICES",
    "LINKS",
    "DeviceProfile",
    "LinkProfile",
    "Model",
    "Prediction",
    "expected_error",
    "link_named",
]
