"""Tuning: the α-β cost model of pycoll's plans (``model``), its link and device parameters (``links``),
and their calibration on the current machine (``calibrate``). ``algorithm="auto"`` and
``compression="auto"`` choose by the model."""

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
